import os

# Tests run on CPU; keep XLA from grabbing every core's worth of threads.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
