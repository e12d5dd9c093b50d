import os

# Tests run on CPU; keep XLA from grabbing every core's worth of threads.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The command line turns on JAX's persistent compilation cache; the suite's
# numbers must not depend on what earlier runs left on disk
# (tests/fedsim/test_compile_cache.py turns it on where it tests it).
os.environ.setdefault("FEDSIM_COMPILE_CACHE", "0")
# The suite's tolerances are float32's. Where it runs on a GPU
# (JAX_PLATFORMS=cuda, benchmarks/gpu_session.sh), JAX would otherwise let
# XLA compute float32 products in TF32 in the code the engine does not wrap
# (attacks and defenses called directly); the engine's own setting,
# training.matmul_precision, is tested in tests/fedsim/test_simulation.py.
os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")
