#!/usr/bin/env bash
# One GPU call that checks `client_parallelism: auto` on an accelerator, where
# vmap's cost per client falls with the cohort: its two-stage calibration
# (16 clients, then the close contenders on at most 256 clients of the real
# cohort, fedsim/calibrate.py) against every fixed strategy, at 1,000 and 5,000
# LeNet-5 clients, in the same run as a PyTorch loop on the same GPU.
#   1. at the config's matrix-product precision ("highest": full float32);
#   2. vmap and auto at 1,000 clients at XLA's default precision (TF32 on
#      recent NVIDIA GPUs), to show what full float32 costs.
#
# Usage (repo root, on a machine with a CUDA jax and torch; wheels in .whl/ as
# for gpu_session.sh):
#   FEDSIM_SOURCE_COMMIT=<commit> bash benchmarks/gpu_session_auto.sh OUT_DIR [ENGINE_SECONDS] [PRECISION_SECONDS]
# Time on an H200 (benchmarks/results/gpu_session_h200_auto/README.md): each
# 1,000-client row 30-60 s, `auto` 110 s (calibration 53-93 s); `auto` at
# 5,000 clients 144 s. The defaults fit the 1,000-client rows and the
# precision part in one 10-minute call; step 1 needs ~700 s for 5,000 too
# (PRECISION_SECONDS 0 skips step 2).
set -u
out=${1:?usage: gpu_session_auto.sh OUT_DIR [ENGINE_SECONDS] [PRECISION_SECONDS]}
engine_s=${2:-330}
precision_s=${3:-150}
source "$(dirname "$0")/gpu_env.sh"  # wheels, PYTHONPATH, $out/environment.txt

timeout -k 5 "$engine_s" python3 benchmarks/engine_throughput.py \
  --torch-device cuda --torch-threads 1 --clients 1000 5000 \
  --impls fedsim-auto fedsim-vmap fedsim-chunked fedsim-map fedsim-loop torch-loop \
  --impl-max-clients fedsim-map=1000 fedsim-loop=1000 torch-loop=1000 \
  --timeout 200 --out "$out/engine_throughput_gpu_auto" 2>&1 | tee "$out/engine_log.txt"
pkill -f "[e]ngine_throughput.py --worker" 2>/dev/null

if [ "$precision_s" -gt 0 ]; then  # 0 skips step 2
  timeout -k 5 "$precision_s" python3 benchmarks/engine_throughput.py \
    --torch-device cuda --clients 1000 --impls fedsim-auto fedsim-vmap --precision default \
    --timeout 100 --out "$out/engine_throughput_gpu_default_precision" 2>&1 \
    | tee -a "$out/engine_log.txt"
  pkill -f "[e]ngine_throughput.py --worker" 2>/dev/null
fi
exit 0
