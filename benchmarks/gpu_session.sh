#!/usr/bin/env bash
# One GPU session's checks, in one call (the lent machine has ~15 min in all):
#   1. the engine-throughput benchmark on the GPU, fedsim against a PyTorch
#      loop on the same GPU (benchmarks/results/engine_throughput_gpu.*);
#   2. the engine's, the attacks' and a few defenses' unit tests on the GPU
#      (written for XLA:CPU; tests/conftest.py runs them at "highest" matmul
#      precision, so what fails there is not TF32).
#
# Usage (repo root, on a machine with a CUDA jax and torch):
#   bash benchmarks/gpu_session.sh OUT_DIR [ENGINE_SECONDS] [PYTEST_SECONDS]
# Python packages the machine lacks may be given as wheels in .whl/ (dm-pix,
# dp-accounting, dm-tree: the GPU image has jax, flax, optax and torch).
# Where the copy of the tree has no .git, set FEDSIM_SOURCE_COMMIT to the
# commit it was made from: the results JSON records it as "<commit>-declared".
set -u
out=${1:?usage: gpu_session.sh OUT_DIR [ENGINE_SECONDS] [PYTEST_SECONDS]}
engine_s=${2:-300}
pytest_s=${3:-140}
source "$(dirname "$0")/gpu_env.sh"  # wheels, PYTHONPATH, $out/environment.txt

# 1. Engine throughput. Each row is its own process and the JSON is rewritten
#    after every row, so a run cut short still leaves its rows.
timeout -k 5 "$engine_s" python3 benchmarks/engine_throughput.py \
  --torch-device cuda --torch-threads 1 --clients 10 100 1000 5000 \
  --impl-max-clients fedsim-loop=1000 fedsim-map=100 torch-loop=1000 \
  --timeout 90 --out "$out/engine_throughput_gpu" 2>&1 | tee "$out/engine_log.txt"
# A row cut off by the timeout; "[e]" keeps pkill from matching a shell whose
# own command line holds this pattern.
pkill -f "[e]ngine_throughput.py --worker" 2>/dev/null

# 2. Unit tests on the GPU (the suite's conftest picks the CPU unless told).
per_test=()
python3 -c "import pytest_timeout" 2>/dev/null && per_test=(--timeout 60)
JAX_PLATFORMS=cuda FEDSIM_COMPILE_CACHE=0 timeout -k 5 "$pytest_s" python3 -m pytest \
  -p no:cacheprovider -o addopts="" -m "not slow" -q -rfE "${per_test[@]}" \
  tests/fedsim/test_simulation.py tests/fedsim/test_aggregation.py \
  tests/fedsim/test_client.py tests/attacks/test_gradient_inversion.py \
  tests/attacks/test_sgi.py tests/defenses/test_soteria.py \
  tests/defenses/test_pruning_defense.py > "$out/pytest_gpu.txt" 2>&1
echo "pytest exit $?" >> "$out/pytest_gpu.txt"
tail -40 "$out/pytest_gpu.txt"
