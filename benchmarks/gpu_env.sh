# Sourced by the GPU session scripts with $out set: installs the wheels in
# .whl/ (dm-pix, dp-accounting, dm-tree: the GPU image has jax, flax, optax and
# torch; add scikit-learn, threadpoolctl and joblib for a script that scores
# AMI, attacks.metrics.ami), sets PYTHONPATH, and writes what the machine is to
# $out/environment.txt, including whether float32 matrix products run as TF32
# by default.
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if [ -n "${FEDSIM_SOURCE_COMMIT:-}" ]; then
  # The lent machine's copy can carry a .git older than the tree it holds
  # (seen 2026-11-26: HEAD 7f08abf beside the tree of 345c254): the declared
  # commit is the one that describes the code, so git is not asked.
  export GIT_DIR=/nonexistent-declared-commit-used
fi
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
{
  date -u
  nvidia-smi -L
  echo "git: $(env -u GIT_DIR git rev-parse HEAD 2>&1 | head -1); declared: ${FEDSIM_SOURCE_COMMIT:-none}"
  python3 -c "import jax, flax, optax, torch; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, 'torch', torch.__version__); print(jax.devices())"
  # float32 matrix products: the largest relative error against float64 says
  # whether XLA used TF32 (~1e-3) or full float32 (~1e-6) by default.
  python3 -c "
import contextlib, jax, jax.numpy as jnp, numpy as np
a = np.random.default_rng(0).standard_normal((1024, 1024)).astype(np.float32)
ref = a.astype(np.float64) @ a.astype(np.float64)
for prec in (None, 'highest'):
    with jax.default_matmul_precision(prec) if prec else contextlib.nullcontext():
        r = np.asarray(jax.jit(jnp.dot)(a, a), np.float64)
    print('float32 matmul, precision', prec or 'default', 'max rel err', float(np.abs(r - ref).max() / np.abs(ref).max()))
"
} 2>&1 | tee "$out/environment.txt"
