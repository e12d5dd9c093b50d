"""How much accelerator memory one call takes, measured from JAX's allocator.

JAX reports an accelerator's ``bytes_in_use`` and ``peak_bytes_in_use`` but
cannot reset the peak, which counts from the process's start. Compilation sets
it first: XLA's autotuning on a GPU allocates scratch buffers on the device,
so a call run after its compile often never raises the peak, and the peak
says nothing about the call (the first H100 session, 2026-11-26,
``benchmarks/results/gpu_session_h100_attacks``).

:func:`device_growth` therefore first lifts ``bytes_in_use`` up to the peak
with a ballast buffer that nothing reads. Then every byte the call allocates
raises the peak, so the peak after the call less ``bytes_in_use`` before it
(the ballast included) is the call's own growth: its temporaries and outputs
above what was already resident. The ballast is freed afterwards. It takes
device memory while the call runs, as much as the process's earlier peak less
what is in use, so a call that only just fits can run out of memory under it.
"""

from __future__ import annotations

import time

MAX_BALLASTS = 4  # top-ups where the allocator rounds a ballast down


def allocate_bytes(device, nbytes: int):
    """A buffer of ``nbytes`` zero bytes on ``device``, made on the device."""
    import jax
    import jax.numpy as jnp

    out = jax.jit(lambda: jnp.zeros((nbytes,), jnp.uint8), out_shardings=(
        jax.sharding.SingleDeviceSharding(device)))()
    return out.block_until_ready()


def _stats(device) -> dict:
    stats = device.memory_stats() or {}
    if "peak_bytes_in_use" not in stats or "bytes_in_use" not in stats:
        raise SystemExit(f"{device} reports no peak_bytes_in_use: measure the CPU with "
                         "--device cpu")
    return stats


def device_growth(call, device, allocate=allocate_bytes, record: dict | None = None):
    """(call's result, seconds, ``device``'s allocated-byte growth while it ran).

    The growth is the allocator's peak after the call less its bytes in use
    before it, with the bytes in use first lifted to the earlier peak by a
    ballast (module docstring), so that the call's allocations raise the peak.
    It is None where the ballast could not lift them there (the allocator
    refused it, or kept rounding it down).

    Args:
      call: runs the measured work and blocks until it is done.
      device: a JAX device with ``memory_stats``.
      allocate: ``allocate(device, nbytes)`` returns a live buffer of at
        least ``nbytes`` bytes (tests pass a fake).
      record: if given, receives ``ballast_bytes`` (how far the ballast lifted
        the bytes in use: the earlier peak's excess, from compilation) and
        ``bytes_in_use_before`` (the resident bytes the growth is counted from).

    Raises:
      SystemExit: the device reports no ``peak_bytes_in_use``.
    """
    stats = _stats(device)
    resident = stats["bytes_in_use"]
    ballast = []
    try:
        for _ in range(MAX_BALLASTS):
            gap = stats["peak_bytes_in_use"] - stats["bytes_in_use"]
            if gap <= 0:
                break
            ballast.append(allocate(device, gap))
            stats = _stats(device)
    except Exception as e:  # noqa: BLE001 - out of memory: measure without it
        print(f"device_growth: no ballast ({type(e).__name__}: {e}); the growth is "
              "measured only if the call raises the earlier peak", flush=True)
        stats = _stats(device)
    before, peak_before = stats["bytes_in_use"], stats["peak_bytes_in_use"]
    lifted = before >= peak_before
    if record is not None:
        record.update(ballast_bytes=before - resident, bytes_in_use_before=before)
    t0 = time.perf_counter()
    out = call()
    seconds = time.perf_counter() - t0
    peak = _stats(device)["peak_bytes_in_use"]
    del ballast
    grown = peak - before if (lifted or peak > peak_before) else None
    return out, seconds, grown
