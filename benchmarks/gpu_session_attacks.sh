#!/usr/bin/env bash
# One GPU call for the attack suite (benchmarks/results/gpu_session_h100_attacks/
# has the first run's readings):
#   1. attack_memory --device gpu: XLA's plan for a vmapped Inverting Gradients
#      call against the GPU allocator's peak (is PLAN_MARGIN, fitted on the
#      CPU, enough there?), plus a split forced by a pretended free memory;
#      then again with XLA's autotuning off. In the first run the call never
#      raised the process's peak, which the plan's compile had set first.
#   2. attack_throughput on the DLG LeNet at 32×32×3: vmapped victims against
#      a one-by-one loop and a PyTorch loop on the same GPU;
#   3. if at least 150 s are left: the engine at 1,000 LeNet-5 clients, `auto`
#      against vmap and chunked, with each row's memory plan beside its device peak.
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
timeout -k 5 "$(budget 150)" python3 -m benchmarks.attack_memory --device gpu \
  --runs 64 256 --batch 8 --pretend-free-gib 2 --timeout 90 \
  --name attack_memory_gpu --out "$out" 2>&1 | tee -a "$out/log.txt"
step attack_memory, autotuning off
XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_autotune_level=0" timeout -k 5 "$(budget 120)" \
  python3 -m benchmarks.attack_memory --device gpu --runs 64 256 --batch 8 --timeout 90 \
  --name attack_memory_gpu_no_autotune --out "$out" 2>&1 | tee -a "$out/log.txt"

step attack_throughput
timeout -k 5 "$(budget 200)" python3 -m benchmarks.attack_throughput --model lenet \
  --victims 1 8 64 256 --torch-max-victims 8 --torch-device cuda \
  --name attack_throughput_gpu_lenet --out "$out" 2>&1 | tee -a "$out/log.txt"

if (( $(budget 150) < 150 )); then step "engine_throughput skipped: under 150 s left"; exit 0; fi
step engine_throughput
timeout -k 5 "$(budget 330)" python3 benchmarks/engine_throughput.py \
  --torch-device cuda --clients 1000 --impls fedsim-auto fedsim-vmap fedsim-chunked \
  --timeout 150 --out "$out/engine_throughput_gpu_roundrobin" 2>&1 | tee -a "$out/log.txt"
pkill -f "[e]ngine_throughput.py --worker" 2>/dev/null
step done
exit 0
