#!/usr/bin/env bash
# One GPU call for the memory plans (benchmarks/results/gpu_session_h100_attacks/
# has the first run's readings, where compilation's peak hid every call):
#   1. attack_memory --device gpu: XLA's plan for a vmapped Inverting Gradients
#      call against the GPU allocator's growth during the call, measured above
#      a ballast that lifts the bytes in use to compilation's peak
#      (benchmarks/device_memory.py), for a first and a second call; plus a
#      split forced by a pretended free memory. Is PLAN_MARGIN (2.1, fitted on
#      the CPU) enough there?
#   2. engine_throughput at 1,000 LeNet-5 clients, `auto` against vmap and
#      chunked: each row's cohort-step plan beside one round's measured growth;
#   3. attack_memory again with XLA's autotuning off, in what time is left
#      (does autotuning change the plan or the growth?).
# attack_throughput is not run: its GPU rows are in gpu_session_h100_attacks/call2.
# Each step's budget is the smaller of its cap and what is left of the total.
#
# Usage (repo root, wheels in .whl/ as for gpu_session.sh):
#   FEDSIM_SOURCE_COMMIT=<commit> bash benchmarks/gpu_session_attacks.sh OUT_DIR [TOTAL_SECONDS]
set -u
out=${1:?usage: gpu_session_attacks.sh OUT_DIR [TOTAL_SECONDS]}
total=${2:-540}
start=$SECONDS
source "$(dirname "$0")/gpu_env.sh"  # wheels, PYTHONPATH, $out/environment.txt
budget() {  # budget CAP: seconds for the next step
  local left=$(( total - (SECONDS - start) - 10 ))
  (( left < $1 )) && echo $(( left > 0 ? left : 1 )) || echo "$1"
}
step() { echo "== $(( SECONDS - start )) s: $*" | tee -a "$out/log.txt"; }

step attack_memory
# The first process on a fresh machine took over 50 s (CUDA start, compilation).
timeout -k 5 "$(budget 170)" python3 -m benchmarks.attack_memory --device gpu \
  --runs 64 256 --batch 8 --pretend-free-gib 2 --timeout 90 \
  --name attack_memory_gpu --out "$out" 2>&1 | tee -a "$out/log.txt"

step engine_throughput
timeout -k 5 "$(budget 230)" python3 benchmarks/engine_throughput.py \
  --torch-device cuda --clients 1000 --impls fedsim-auto fedsim-vmap fedsim-chunked \
  --timeout 150 --out "$out/engine_throughput_gpu_memory" 2>&1 | tee -a "$out/log.txt"
pkill -f "[e]ngine_throughput.py --worker" 2>/dev/null

if (( $(budget 60) < 60 )); then step "attack_memory, autotuning off: skipped, under 60 s left"; exit 0; fi
step attack_memory, autotuning off
XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_autotune_level=0" timeout -k 5 "$(budget 120)" \
  python3 -m benchmarks.attack_memory --device gpu --runs 64 256 --batch 8 --timeout 60 \
  --name attack_memory_gpu_no_autotune --out "$out" 2>&1 | tee -a "$out/log.txt"
step done
exit 0
