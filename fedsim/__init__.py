"""fedsim: a JAX engine for simulating federated learning under attack."""

__version__ = "0.1.0"
