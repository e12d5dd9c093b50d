"""Noise on the client update (stage "upload"): DP-Gaussian, DP-Laplace, client-level DP.

* ``update_gaussian(sigma)`` / ``update_laplace(scale)``: the DP-Gaussian and
  DP-Laplace baselines of Soteria (Sun et al., 003 §6.1, Table 2: σ ∈
  [1e-4, 1e-1]): i.i.d. N(0, sigma²) resp. Laplace(0, scale) noise added to
  every coordinate of the shared update. ``sigma`` is the standard deviation
  and ``scale`` Laplace's b, while 003 §6.1 calls its σ the *variance* ("we
  set the mean and variance of the noise distribution as 0 and σ"): for a
  Table 2 value σ pass ``sigma=√σ`` resp. ``scale=√(σ/2)`` (a Laplace(0, b)
  has variance 2b²), as ``benchmarks/reproduce_sun2021.dp_noise_scale`` does.
  As in Soteria (and DLG, Zhu et al. 2019) the update is NOT clipped, so these
  give no formal DP guarantee; pass ``clip_norm`` to clip the update first (L2
  for Gaussian, L1 for Laplace), which makes them the Gaussian (sigma/C noise
  multiplier) resp. Laplace (ε = C/b) mechanism on one client's update, with
  add/remove adjacency (an update against none); against replacement (one
  client's update against another's) the sensitivity is 2C: ε = 2C/b. A
  Simulation reports the latter, local DP of each upload composed over the
  client's uploads (``local_epsilon``, :mod:`defenses.dp.local_accountant`).
* ``client_level_dp(clip_norm, noise_multiplier, clients_per_round)``:
  DP-FedAvg (McMahan et al., ICLR 2018): clip each client update to L2 norm C
  and add Gaussian noise so that the SUM over the m clients of a round carries
  N(0, σ²C²). The engine has no server-side noise hook, so the noise is added
  in distributed form, N(0, σ²C²/m) per client (the sum of m independent
  shares is exactly N(0, σ²C²)). Guarantee (user-level, for the aggregate,
  assuming an honest aggregator that only reveals the sum and
  ``training.weighting: uniform``): the Gaussian mechanism with multiplier σ
  per round. Deviation: a curious server that sees individual uploads sees
  only 1/√m of the noise; say so when using it against per-client attacks.
  A Simulation reports the user-level ε of every round
  (``client_level_epsilon``, :mod:`defenses.dp.client_accountant`) and,
  for that curious server, the local ε of each client's uploads at their
  share of the noise (``local_epsilon``, :mod:`defenses.dp.local_accountant`).
"""

from __future__ import annotations

import functools
import math
import numbers

import jax
import jax.numpy as jnp

from fedsim.hooks import Defense, register_defense
from fedsim.keys import require_key
from defenses.dp._flat import flatten_batched
from defenses.dp._params import DPParameters
from defenses.dp.clipping import check_positive


def _flat(update):
    batched = jax.tree_util.tree_map(lambda u: u[None], update)
    matrix, unflatten = flatten_batched(batched)
    return matrix[0], unflatten


def _clip(vector, clip_norm, ord_):
    norm = jnp.sum(jnp.abs(vector)) if ord_ == 1 else jnp.sqrt(jnp.sum(vector * vector))
    return vector / jnp.maximum(1.0, norm / clip_norm)


def _noisy_upload(noise, clip_norm: float | None, ord_: int, name: str,
                  guarantee: DPParameters | None = None) -> Defense:
    """Upload defense: optionally clip the flat update in L``ord_``, then add ``noise``.

    ``guarantee`` (with a clip only: unclipped, the noise bounds nothing) is
    the local DP of each upload, which :mod:`defenses.dp.local_accountant` reports.
    """

    def apply(update, state, *, key, context=None):
        require_key(key, name)
        v, unflatten = _flat(update)
        if clip_norm is not None:
            v = _clip(v, clip_norm, ord_)
        return unflatten(v + noise(key, v.shape, v.dtype)), state

    guarantees = () if clip_norm is None or guarantee is None else (guarantee,)
    return Defense(lambda p: (), apply, "upload", name, guarantees=guarantees)


@register_defense("update_gaussian")
def update_gaussian(sigma: float, clip_norm: float | None = None) -> Defense:
    """Add N(0, σ²) to every coordinate of the upload (Soteria's DP-Gaussian)."""
    sigma = check_positive("sigma", sigma)
    clip = None if clip_norm is None else check_positive("clip_norm", clip_norm)

    noise = lambda key, shape, dtype: sigma * jax.random.normal(key, shape, dtype)
    local = None if clip is None else DPParameters(
        "gauss", noise_multiplier=sigma / clip, clip_norm=clip, level="local")
    return _noisy_upload(noise, clip, 2, f"update_gaussian(sigma={sigma:g})", local)


@register_defense("update_laplace")
def update_laplace(scale: float, clip_norm: float | None = None) -> Defense:
    """Add Laplace(0, b = scale) to every coordinate of the upload (Soteria's DP-Laplace)."""
    scale = check_positive("scale", scale)
    clip = None if clip_norm is None else check_positive("clip_norm", clip_norm)

    noise = lambda key, shape, dtype: scale * jax.random.laplace(key, shape, dtype)
    local = None if clip is None else DPParameters(
        "laplace", noise_multiplier=scale / clip, clip_norm=clip, level="local")
    return _noisy_upload(noise, clip, 1, f"update_laplace(b={scale:g})", local)


@register_defense("client_level_dp")
def client_level_dp(clip_norm: float, noise_multiplier: float,
                    clients_per_round: int) -> Defense:
    """Clip the client update to C and add its share N(0, σ²C²/m) of the round's noise.

    DP-FedAvg (McMahan et al., ICLR 2018, Alg 1; accounted as in its §3, see
    :mod:`defenses.accounting._dp_fedavg`). Deviation: the paper's server adds
    N(0, σ²C²) to the sum; here each of the m clients adds its share, whose
    sum has the same distribution (a trusted server is not assumed).

    ``clients_per_round`` (m) must be the number of clients whose shares the
    server sums, i.e. the run's ``training.clients_per_round``, with
    ``training.weighting: uniform``: a Simulation refuses anything else
    (:func:`check_client_level_dp`). With a larger m the round would carry
    √(K/m)·σC instead of σC.

    Raises:
      ValueError: on a non-positive or non-finite C or σ, or an m that is not
        a positive integer (2.5, True and "3" included).
    """
    clip = check_positive("clip_norm", clip_norm)
    sigma = check_positive("noise_multiplier", noise_multiplier)
    m = clients_per_round
    if isinstance(m, bool) or not isinstance(m, numbers.Integral) or int(m) < 1:
        raise ValueError(f"clients_per_round must be a positive integer (the round's cohort "
                         f"size), got {m!r}")
    m = int(m)
    share = sigma * clip / math.sqrt(m)

    def apply(update, state, *, key, context=None):
        v, unflatten = _flat(update)
        require_key(key, "client_level_dp")
        v = _clip(v, clip, 2)
        return unflatten(v + share * jax.random.normal(key, v.shape, v.dtype)), state

    return Defense(lambda p: (), apply, "upload",
                   f"client_level_dp(C={clip:g},sigma={sigma:g},m={m})",
                   config_checks=(functools.partial(check_client_level_dp, m),),
                   guarantees=(
                       DPParameters("gauss", noise_multiplier=sigma, clip_norm=clip,
                                    level="client"),
                       # What one upload carries: its share, std σC/√m.
                       DPParameters("gauss", noise_multiplier=sigma / math.sqrt(m),
                                    clip_norm=clip, level="local")))


def check_client_level_dp(clients_per_round: int, cfg, name: str = "client_level_dp") -> None:
    """Refuse a ``client_level_dp`` whose noise shares do not add up to σC.

    The shares sum to N(0, σ²C²) only when m equals the cohort the server
    sums over and the server weighs every client alike (a mean with
    example-count weights is not the Gaussian mechanism with multiplier σ
    on the clipped updates). A Simulation runs it on its config through the
    defense's ``config_checks``, wherever the defense sits (chained, renamed,
    inside a pruning mask).

    Args:
      clients_per_round: the defense's m.
      cfg: the run's :class:`fedsim.config.Config`.
      name: the defense the messages name (``adaptive_client_level_dp`` too).

    Raises:
      fedsim.config.ConfigError: naming ``training.clients_per_round`` or
        ``training.weighting``.
    """
    from fedsim.config import ConfigError

    t = cfg.training
    if clients_per_round != t.clients_per_round:
        raise ConfigError(
            f"{name}: clients_per_round={clients_per_round} but the run samples "
            f"training.clients_per_round={t.clients_per_round} clients a round; the "
            "noise shares add up to σC only over the clients actually summed")
    if t.weighting != "uniform":
        raise ConfigError(
            f"{name} needs training.weighting: uniform (got {t.weighting!r}): its "
            "guarantee is for the clipped updates' sum, which example-count weights rescale")
