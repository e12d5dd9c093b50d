import os

# Tests run on CPU; keep XLA from grabbing every core's worth of threads.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The command line turns on JAX's persistent compilation cache; the suite's
# numbers must not depend on what earlier runs left on disk
# (tests/fedsim/test_compile_cache.py turns it on where it tests it).
os.environ.setdefault("FEDSIM_COMPILE_CACHE", "0")
