#!/usr/bin/env bash
# Every 5 s, one line: the time, then for each python process holding more than
# 1,000 memory mappings, "CWD:PID:MAPPINGS:RSS" (CWD: the last part of its working
# directory, which tells apart CI rehearsals run side by side from their own clones).
# XLA:CPU maps each compiled program's code into the process, and a process past
# the kernel's vm.max_map_count segfaults (benchmarks/diagnose_map_count.py); this
# watches a test suite's workers approach it.
#
#   bash benchmarks/watch_mappings.sh > maps.log &   # stop it with kill
set -u
while true; do
  line="$(date +%H:%M:%S)"
  for p in $(pgrep -f python); do
    n=$(wc -l < "/proc/$p/maps" 2>/dev/null) || continue
    if [ -n "$n" ] && [ "$n" -gt 1000 ]; then
      cwd=$(basename "$(readlink "/proc/$p/cwd" 2>/dev/null)")
      rss=$(awk '/VmRSS/{printf "%.1fG", $2/1048576}' "/proc/$p/status" 2>/dev/null)
      line="$line | $cwd:$p:$n:$rss"
    fi
  done
  echo "$line"
  sleep 5
done
