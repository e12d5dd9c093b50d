#!/usr/bin/env bash
# One GPU call for issue 8's GS side: is the 1.18x bound of
# benchmarks/results/soteria_gs_architecture.md (width-32 ConvNet, 32x32, the
# paper's 120 GS iterations, CPU) a property of Soteria or of a weak attack?
# Runs benchmarks.soteria_gs_architecture at 120 iterations (the CPU run again,
# now on the GPU: same victims, keys and settings), then at larger budgets, each
# in its own folder with its own JSON/markdown/PNG; a step that would not fit the
# time left is skipped, one that runs out of time leaves no files.
#
# Usage (repo root, wheels in .whl/ as for gpu_session.sh, the Fashion-MNIST idx
# files in .fmnist/ -- copied from /usr/share/datasets/fashion-mnist):
#   FEDSIM_SOURCE_COMMIT=<commit> bash benchmarks/gpu_session_soteria_gs.sh OUT_DIR [TOTAL_SECONDS] [ITERATIONS...]
# $GS_ARGS goes to every run (e.g. "--p-fc 0.2 --baselines dp_gaussian": fewer
# settings where the device time is short).
set -u
out=${1:?usage: gpu_session_soteria_gs.sh OUT_DIR [TOTAL_SECONDS] [ITERATIONS...]}
total=${2:-480}
shift $(( $# >= 2 ? 2 : 1 ))
budgets=("$@")
(( ${#budgets[@]} )) || budgets=(120 1200 4800)
start=$SECONDS
source "$(dirname "$0")/gpu_env.sh"  # wheels, PYTHONPATH, $out/environment.txt
export FEDSIM_FASHION_MNIST_DIR=${FEDSIM_FASHION_MNIST_DIR:-$PWD/.fmnist}
for it in "${budgets[@]}"; do
  left=$(( total - (SECONDS - start) - 10 ))
  if (( left < 60 )); then echo "== iterations $it: skipped, ${left} s left" | tee -a "$out/log.txt"; continue; fi
  echo "== $(( SECONDS - start )) s: iterations $it (limit ${left} s)" | tee -a "$out/log.txt"
  timeout -k 5 "$left" python3 -m benchmarks.soteria_gs_architecture --iterations "$it" ${GS_ARGS:-} \
    --out "$out/it$it" 2>&1 | tee -a "$out/log.txt"
done
echo "== $(( SECONDS - start )) s: done" | tee -a "$out/log.txt"
