"""The interface through which the engine runs defenses.

A defense is an optax-style pair of pure functions built by a factory that
closes over its hyper-parameters (DESIGN.md, "Defenses"):

* ``init(params) -> state``: the per-client state (``()`` when stateless).
* ``apply(value, state, *, key, context) -> (value', state')``.

and a ``stage`` telling the engine where it acts:

* ``"data"``: ``value`` is a batch of inputs x [B, ...]; returns x̃.
* ``"example"``: ``value`` is the per-example gradients (leaves [B, ...]);
  returns ONE gradient (the reduction, e.g. clip + sum + noise / B).
* ``"layer"``: ``value`` is the batch gradient; returns it with one or more
  layers' gradient replaced (e.g. Soteria).
* ``"upload"``: ``value`` is the client update Δ; returns the update sent.

Optionally ``begin_round(global_params, state, *, key, context) ->
(start_params, state)`` lets a defense choose the local model a client starts
from (Pseudo-Pruning composes withheld weights back in). The engine imports
the :mod:`defenses` package only through this module's registry.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any, Callable, NamedTuple

import jax

from fedsim.defense_spec import factory_spec
from fedsim.suggest import did_you_mean, did_you_mean_each
from fedsim.typing import PyTree

STAGES = ("data", "example", "layer", "upload")


class DefenseContext(NamedTuple):
    """What the engine tells a defense about the step it runs in.

    Fields a stage has no use for are ``None``.

    Attributes:
      params: the current local parameters (before this step's update).
      x: float32 [B, ...] the batch inputs.
      y: int32 [B] the batch labels.
      mask: float32 [B] 1 for real examples, 0 for padding.
      apply_fn: ``apply_fn(params, x) -> logits``. For a model with batch
        norm, training mode normalised by the statistics of the batch's real
        examples (``mask``), so it takes this step's whole batch only.
      global_params: the global parameters this round started from.
      step: int32 scalar, local step index.
      num_examples: float32 scalar, the client's real example count.
    """

    params: PyTree = None
    x: jax.Array | None = None
    y: jax.Array | None = None
    mask: jax.Array | None = None
    apply_fn: Callable | None = None
    global_params: PyTree = None
    step: jax.Array | None = None
    num_examples: jax.Array | None = None


class Defense(NamedTuple):
    """A pure defense: ``init``/``apply`` closed over its hyper-parameters.

    Attributes:
      init: ``init(params) -> state``.
      apply: ``apply(value, state, *, key, context) -> (value, state)``.
      stage: one of :data:`STAGES`.
      name: a short human-readable name (used in logs and results).
      begin_round: optional ``begin_round(global_params, state, *, key,
        context) -> (start_params, state)``.
      local_training: optional: a defense whose own local training replaces
        the engine's brings it here, as a ``client_update_factory`` (the
        signature of :func:`fedsim.client.make_client_update`), e.g. PriPrune's
        joint steps on the weights and its mask parameters. A
        :class:`~fedsim.simulation.Simulation` built from a config uses it. Such a
        defense cannot be chained with others of its stage (its local training
        reads its own state).
      discards_example_stage: True for a "layer" defense that recomputes (part
        of) the gradient from the batch itself, e.g. Soteria's ∂l/∂b · r′ᵀ: what
        an "example" defense did to that part (DP-SGD's clipping and noise) is
        lost, so the engine refuses the two together
        (:func:`check_stage_compatibility`).
      batch_statistics: True for a "layer" defense that is defined on a model
        with batch norm, whose examples' gradients depend on their batch: it
        reads the batch only through ``context.apply_fn`` on the whole batch
        and never needs one example's gradient on its own (Soteria with its
        batched Jacobian, the authors' code's computation). The engine refuses
        every other "layer" defense on such a model.
      config_checks: callables ``check(cfg)`` that a
        :class:`~fedsim.simulation.Simulation` runs on its config as soon as its
        defenses are built (before anything compiles); each raises
        :class:`fedsim.config.ConfigError` naming the config key the defense
        cannot run with, e.g. ``client_level_dp``'s cohort size against
        ``training.clients_per_round``. A field rather than a check keyed on
        the defense's name, so that it survives chaining, renaming and masking.
      scan_local_steps: True for a defense whose step unrolls badly: the engine
        then runs the local steps in a ``lax.scan`` whatever
        ``training.unroll_steps`` (:func:`fedsim.client.make_client_update`).
        For a step with data-dependent loops, e.g. ``dp_vmf``'s rejection
        sampler: each unrolled copy compiles them again, for little speed
        (LeNet-5: unrolling paid after 1,245 rounds against 51 without the
        defense; ``benchmarks/results/unroll_steps_vmf_lenet5_cpu.md``).
      spec: what the defense was built from, in full: the registered factory's
        name and every argument, arrays by digest (:mod:`fedsim.defense_spec`;
        :func:`register_defense` fills it in). It stands for the defense where
        the name is not enough (two natural channels calibrated on different
        data share a name): a checkpoint of hand-given defenses and the
        calibration key. ``""`` for a defense built by hand, whose name then
        stands for it (:func:`spec_of`); ``_replace(name=...)`` keeps it.
      end_round: optional ``end_round(states, ids, cohort_states) -> states``,
        the server's step of a defense with server-side state, run once per
        round after the cohort trained (every strategy, in the same compiled
        step as the aggregation). ``states`` is the defense's state for
        every client (leaves [N, ...]) with the cohort's new states already
        written at ``ids``; ``cohort_states`` is the cohort's (leaves [C, ...],
        in the order of ``ids``). What it returns becomes every client's
        state for the next round: e.g. adaptive clipping (Andrew et al. 2021,
        ``defenses.dp.adaptive_client_level_dp``) sums the cohort's noised
        unclipped bits and gives every client the next clip norm. A client
        skipped for a NaN/Inf update keeps its state from before the round;
        a round that skipped every client has no server step (this one
        included).
      guarantees: what the defense promises, as objects an accountant reads
        (:class:`defenses.dp.DPParameters`, whose accountants report ε;
        :class:`defenses.channels.ChannelGuarantee`, whose leakage ledger
        reports n·κ). The engine interprets none of them; it
        carries them through :func:`chain` (concatenated; a part's that later
        parts act after come wrapped in :class:`FollowedBy`, since whether a
        guarantee survives per-client processing after it is the guarantee's
        own business), renames and the global pruning mask (:func:`mask_around`
        masks before and after the defense with one public mask, which every
        guarantee here survives).
    """

    init: Callable[[PyTree], PyTree]
    apply: Callable[..., tuple[Any, PyTree]]
    stage: str
    name: str = "defense"
    begin_round: Callable[..., tuple[PyTree, PyTree]] | None = None
    local_training: Callable | None = None
    discards_example_stage: bool = False
    batch_statistics: bool = False
    config_checks: tuple[Callable[[Any], None], ...] = ()
    scan_local_steps: bool = False
    spec: str = ""
    guarantees: tuple[Any, ...] = ()
    end_round: Callable[[PyTree, Any, PyTree], PyTree] | None = None


class FollowedBy(NamedTuple):
    """A guarantee of a :func:`chain`'s part that later parts of the chain act after.

    Attributes:
      guarantee: the part's guarantee (itself possibly a ``FollowedBy``, from
        an inner chain).
      later: the names of the defenses that act after it.
    """

    guarantee: Any
    later: tuple[str, ...]


def unwrap_guarantee(g: Any) -> tuple[Any, tuple[str, ...]]:
    """(the guarantee inside any :class:`FollowedBy` wrappers, the names acting after it)."""
    later: tuple[str, ...] = ()
    while isinstance(g, FollowedBy):  # outer wrappers name the parts that act last
        later = g.later + later
        g = g.guarantee
    return g, later


def spec_of(defense: Defense) -> str:
    """``defense.spec``, or its name where it has none (a hand-built Defense)."""
    return defense.spec or defense.name


def check_stage_compatibility(defenses: dict[str, Defense]) -> None:
    """Refuse stage combinations where one defense silently undoes another.

    A "layer" defense with ``discards_example_stage`` rebuilds gradient
    entries from the raw batch; after an "example" defense (per-example
    clipping and noise) those entries would be released unclipped and
    noise-free while an accountant still reports the example defense's ε.

    Raises:
      ValueError: naming both defenses.
    """
    layer, example = defenses.get("layer"), defenses.get("example")
    if layer is not None and example is not None and layer.discards_example_stage:
        raise ValueError(
            f"the 'layer' defense {layer.name!r} recomputes gradient entries from the batch, "
            f"discarding what the 'example' defense {example.name!r} did to them (clipping, "
            "noise), so its privacy guarantee would not hold for the released update; use one "
            "of the two")


def identity(stage: str) -> Defense:
    """A defense that does nothing at ``stage`` (the engine's default)."""
    _check_stage(stage)

    def apply(value, state, *, key=None, context=None):
        del key, context
        return value, state

    return Defense(init=lambda params: (), apply=apply, stage=stage, name="identity",
                   batch_statistics=True)


def chain(*defenses: Defense) -> Defense:
    """Compose defenses of one stage, applied left to right.

    Each defense gets its own key: the chain folds the defense's index into the
    key it receives, so two chained defenses never share randomness.

    Raises:
      ValueError: if the defenses act at different stages, several act at the
        "example" stage (each reduces a batch's per-example gradients to one),
        or one of several brings its own local training
        (``Defense.local_training``; alone, such a defense is returned as it is).
    """
    if not defenses:
        raise ValueError("chain() needs at least one defense")
    stages = {d.stage for d in defenses}
    if len(stages) != 1:
        raise ValueError(f"chain(): defenses act at different stages {sorted(stages)}")
    (stage,) = stages
    own = [d.name for d in defenses if d.local_training is not None]
    if own and len(defenses) > 1:
        raise ValueError(f"defense {own[0]!r} brings its own local training, which reads its "
                         f"own state, so it cannot be chained with other {stage!r} defenses "
                         f"(got {', '.join(d.name for d in defenses)})")
    if own:  # alone: itself, its state where its local training looks for it
        return defenses[0]
    if stage == "example" and len(defenses) > 1:
        # An "example" defense reduces the per-example gradients to one gradient;
        # the next would take that gradient for a batch of examples.
        raise ValueError(f"defenses {', '.join(d.name for d in defenses)} all act at the "
                         "'example' stage, which reduces the per-example gradients to one "
                         "gradient, so only one can; use one example-stage defense")
    late = [d.name for d in defenses[1:] if d.discards_example_stage]
    if late:
        raise ValueError(f"defense {late[0]!r} recomputes gradient entries from the batch, "
                         f"discarding what the {stage!r} defenses before it in the chain did "
                         f"to them; put it first (got {', '.join(d.name for d in defenses)})")

    def init(params):
        return tuple(d.init(params) for d in defenses)

    def apply(value, state, *, key, context=None):
        new_states = []
        for i, (d, s) in enumerate(zip(defenses, state)):
            value, s = d.apply(value, s, key=jax.random.fold_in(key, i), context=context)
            new_states.append(s)
        return value, tuple(new_states)

    def begin(global_params, state, *, key, context=None):
        params = global_params
        new_states = []
        for i, (d, s) in enumerate(zip(defenses, state)):
            if d.begin_round is not None:
                params, s = d.begin_round(
                    params, s, key=jax.random.fold_in(key, i), context=context
                )
            new_states.append(s)
        return params, tuple(new_states)

    def end(states, ids, cohort_states):
        return tuple(d.end_round(s, ids, c) if d.end_round is not None else s
                     for d, s, c in zip(defenses, states, cohort_states))

    # The chain has a begin_round (end_round) only where one of its defenses has one.
    has_begin = any(d.begin_round is not None for d in defenses)
    has_end = any(d.end_round is not None for d in defenses)
    name = "+".join(d.name for d in defenses)
    return Defense(init=init, apply=apply, stage=stage, name=name,
                   begin_round=begin if has_begin else None,
                   end_round=end if has_end else None,
                   discards_example_stage=any(d.discards_example_stage for d in defenses),
                   batch_statistics=all(d.batch_statistics for d in defenses),
                   config_checks=tuple(c for d in defenses for c in d.config_checks),
                   scan_local_steps=any(d.scan_local_steps for d in defenses),
                   spec="+".join(spec_of(d) for d in defenses),
                   guarantees=tuple(
                       g if i == len(defenses) - 1
                       else FollowedBy(g, tuple(x.name for x in defenses[i + 1:]))
                       for i, d in enumerate(defenses) for g in d.guarantees))


def _check_stage(stage: str) -> None:
    if stage not in STAGES:
        raise ValueError(f"unknown defense stage {stage!r}; allowed: {', '.join(STAGES)}"
                         f"{did_you_mean(stage, STAGES)}")


# --- registry -------------------------------------------------------------
# Factories register themselves here (``defenses`` does it on import) so that a
# config can name a defense without the engine importing every module.
DEFENSE_REGISTRY: dict[str, Callable[..., Defense]] = {}


def register_defense(name: str):
    """Decorator registering a defense factory under ``name``.

    The factory is wrapped so that the :class:`Defense` it returns carries its
    ``spec``: ``name`` and every argument of the call, defaults filled in
    (:func:`fedsim.defense_spec.factory_spec`). Called directly or through
    :func:`build_defense`, the defense is the same.
    """

    def deco(fn):
        @functools.wraps(fn)
        def factory(*args, **kwargs):
            defense = fn(*args, **kwargs)
            if isinstance(defense, Defense):
                defense = defense._replace(spec=factory_spec(name, fn, args, kwargs))
            return defense

        return _registering(DEFENSE_REGISTRY, "defense", name)(factory)

    return deco


def _registering(registry: dict, what: str, name: str):
    """A decorator putting its function in ``registry`` under ``name`` (once;
    a wrapper of the function already there counts as it)."""

    def deco(fn):
        if name in registry and _unwrapped(registry[name]) is not _unwrapped(fn):
            raise ValueError(f"{what} {name!r} registered twice")
        registry[name] = fn
        return fn

    return deco


def _unwrapped(fn):
    return getattr(fn, "__wrapped__", fn)


def build_defense(name: str, **kwargs) -> Defense:
    """Build a registered defense by name.

    Raises:
      ValueError: for an unknown name (listing the known ones) or bad arguments.
    """
    _load_defenses()
    if not isinstance(name, str) or name not in DEFENSE_REGISTRY:
        known = ", ".join(sorted(DEFENSE_REGISTRY)) or "(none registered)"
        raise ValueError(f"unknown defense {name!r}; known defenses: {known}"
                         f"{did_you_mean(name, DEFENSE_REGISTRY)}")
    factory = DEFENSE_REGISTRY[name]
    try:
        return factory(**kwargs)
    except TypeError as e:
        raise ValueError(f"defense {name!r}: bad arguments {kwargs}: {e}; "
                         f"it takes {_parameters(factory)}{_argument_hint(factory, kwargs)}"
                         ) from None


def _argument_hint(fn, kwargs: dict) -> str:
    """"did you mean" for the keyword arguments ``fn`` does not take ("" where it
    takes any, or its signature cannot be read)."""
    import inspect

    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return ""
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return ""
    names = [p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    unexpected = [k for k in kwargs if k not in names]
    return did_you_mean_each(unexpected, names) if unexpected else ""


def _parameters(fn) -> str:
    """``fn``'s keyword parameters with their defaults, for an error message."""
    import inspect

    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a callable without a signature
        return "(its parameters could not be read)"
    shown = [p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}"
             for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    return ", ".join(shown) or "no parameters"


# --- simulation plugins ------------------------------------------------------
# Functions ``plugin(sim) -> None`` run at the end of ``Simulation.__init__``;
# a defense area uses them to attach per-round metrics (e.g. the DP accountant
# adds ``epsilon``/``delta`` through ``sim.round_callbacks``) without the
# engine importing it. A round callback is ``cb(round, row) -> dict`` (merged
# into the round's metrics row), or ``cb(round, row, *, state)`` to be given
# the server state after the round (PriPrune reads its clients' masks there).
SIMULATION_PLUGINS: list[Callable[[Any], None]] = []


def register_simulation_plugin(plugin: Callable[[Any], None]) -> Callable[[Any], None]:
    """Register ``plugin(sim)`` to run on every new Simulation (idempotent)."""
    if plugin not in SIMULATION_PLUGINS:
        SIMULATION_PLUGINS.append(plugin)
    return plugin


def _load_defenses() -> None:
    """Import :mod:`defenses`, whose modules fill this module's registries."""
    try:
        importlib.import_module("defenses")
    except ImportError:  # pragma: no cover - defenses ships with fedsim
        pass


# --- pruned FL: the global mask (paper 002, Chu et al. 2023, Alg 1) ------------
# ``scheme(params, p, *, key, apply_fn, x, y, input_shape, synflow_iterations)
# -> mask``: a base pruning scheme's {0,1} mask (a pytree like ``params``, 1 =
# kept) at rate ``p`` on the initial model. ``defenses.pruning`` registers
# them; a config names one in ``pruning.scheme`` and the engine applies it
# (``fedsim.simulation.Simulation``, :func:`mask_defense`).
MASK_SCHEMES: dict[str, Callable[..., PyTree]] = {}


def register_mask_scheme(name: str):
    """Decorator registering a pruned-FL base scheme under ``name``."""
    return _registering(MASK_SCHEMES, "mask scheme", name)


# ``reconfigure(params, mask, p, *, k, num, key) -> mask``: an iterative
# scheme's reconfiguration k (1-based; k = 0 is the initial mask) of ``num``,
# made by the server on the global model during training.
MASK_RECONFIGURATIONS: dict[str, Callable[..., PyTree]] = {}


def register_mask_reconfiguration(name: str):
    """Decorator registering scheme ``name``'s reconfiguration (it is iterative)."""
    return _registering(MASK_RECONFIGURATIONS, "mask reconfiguration", name)


def reconfigurable_schemes() -> tuple[str, ...]:
    """The iterative schemes' names (those with a reconfiguration), sorted."""
    _load_defenses()
    return tuple(sorted(MASK_RECONFIGURATIONS))


def reconfigure_mask(scheme: str, params: PyTree, mask: PyTree, p: float, *, k: int, num: int,
                     key) -> PyTree:
    """Scheme ``scheme``'s reconfiguration ``k`` of ``num`` of ``mask`` on ``params``.

    Raises:
      ValueError: the scheme is not iterative.
    """
    if scheme not in reconfigurable_schemes():
        raise ValueError(f"pruning scheme {scheme!r} makes its mask once; iterative schemes: "
                         f"{', '.join(reconfigurable_schemes()) or '(none registered)'}")
    return MASK_RECONFIGURATIONS[scheme](params, mask, p, k=k, num=num, key=key)


def mask_schemes() -> tuple[str, ...]:
    """The registered base schemes' names, sorted."""
    _load_defenses()
    return tuple(sorted(MASK_SCHEMES))


def build_mask(scheme: str, params: PyTree, p: float, **kwargs) -> PyTree:
    """The global mask of base scheme ``scheme`` at rate ``p`` on ``params``.

    An iterative scheme run with several reconfigurations is passed
    ``reconfigurations=K`` (its first mask may differ: PruneFL's first step
    prunes to p/K).

    Raises:
      ValueError: an unknown scheme (listing the known ones), or what the
        scheme raises (a rate outside [0, 1], data it lacks).
    """
    if not isinstance(scheme, str) or scheme not in mask_schemes():
        raise ValueError(f"unknown pruning scheme {scheme!r}; known schemes: "
                         f"{', '.join(mask_schemes()) or '(none registered)'}"
                         f"{did_you_mean(scheme, mask_schemes())}")
    return MASK_SCHEMES[scheme](params, p, **kwargs)


def mask_defense(mask: PyTree, stage: str) -> Defense:
    """``value ⊙ mask`` at ``stage``: the global mask inside pruned FL (Alg 1).

    At stage ``"layer"`` it masks every local step's batch gradient, so local
    training never moves a pruned weight (SGD, momentum, Adam and decoupled
    weight decay all keep a zero weight with a zero gradient at zero); at
    ``"upload"`` it masks Δ, so a pruned coordinate is exactly 0 in what the
    server receives. Together with a masked initial model, the server's
    average stays masked (Alg 1 line 11) without a server-side step.
    """
    _check_stage(stage)

    def apply(value, state, *, key=None, context=None):
        del key, context
        return _masked(value, mask), state

    return Defense(init=lambda params: (), apply=apply, stage=stage, name="global_mask")


def _masked(value: PyTree, mask: PyTree) -> PyTree:
    return jax.tree_util.tree_map(lambda v, m: v * m.astype(v.dtype), value, mask)


def mask_around(mask: PyTree, defense: Defense) -> Defense:
    """``defense`` between two applications of the global mask (pruned FL, Alg 1).

    It sees the masked value, and what it puts on pruned coordinates (noise, a
    replaced layer gradient) is taken off again, as the server's mask would
    (Alg 1 line 11). The mask is stateless and keyless, so the result keeps
    ``defense``'s state, key and ``local_training`` as they are: a defense that
    brings its own local training (PriPrune) still finds its state where it
    put it.

    A ``begin_round`` (Pseudo-Pruning's start model, which puts the client's
    withheld weights back) is masked too: a pruned weight is 0 in every model
    a client trains. With a fixed mask this changes nothing (a withheld weight
    was never pruned); when the server prunes again during training
    (PruneFL, FedDST) it keeps a weight the client withheld before it was
    pruned from coming back into the client's forward pass, where its masked
    gradient would leave it at its old value for good.
    """
    _check_stage(defense.stage)

    def apply(value, state, *, key=None, context=None):
        value, state = defense.apply(_masked(value, mask), state, key=key, context=context)
        return _masked(value, mask), state

    # The mask may be traced here (configs' pruning passes it into the compiled
    # steps), so the spec names it without its pattern.
    return mask_start(mask, defense)._replace(apply=apply, name=f"{defense.name}+global_mask",
                                              spec=f"{spec_of(defense)}+global_mask")


def mask_start(mask: PyTree, defense: Defense) -> Defense:
    """``defense`` with the start model its ``begin_round`` makes multiplied by ``mask``.

    Everything else (apply, state, name) is left as it is; a defense without
    ``begin_round`` is returned unchanged. See :func:`mask_around` for why a
    pruned weight must not re-enter a client's start model.
    """
    if defense.begin_round is None:
        return defense
    begin = defense.begin_round

    def begin_round(global_params, state, *, key=None, context=None):
        start, state = begin(global_params, state, key=key, context=context)
        return _masked(start, mask), state

    return defense._replace(begin_round=begin_round)
