"""The simulation: sample a cohort, train it, aggregate, evaluate; repeat.

Cohort strategies (``training.client_parallelism``), all computing the same
numbers up to float rounding (tested; training can grow the rounding, so the
strategy is part of what repeats a run's numbers):

* ``vmap``: all cohort clients vectorised in one jit (accelerators).
* ``map``: ``lax.scan`` over clients in one jit, accumulating the weighted sum
  of updates in the carry, so memory stays at one client's update.
* ``chunked``: ``lax.scan`` over chunks of ``chunk_size`` vmapped clients,
  accumulating likewise.
* ``loop``: a Python loop over one jitted client function.
* ``sharded``: clients sharded over a ``jax.sharding.Mesh`` with a
  ``clients`` axis (all local devices), each device scanning its clients,
  aggregation by ``psum`` (:mod:`fedsim.sharding`).
* ``auto``: the fastest of loop/vmap/map/chunked measured by a short, cached
  calibration on this backend and model (:mod:`fedsim.calibrate`); the choice
  and its timings are in ``strategy_reason`` (written to the run log).

On XLA:CPU vmapped per-client weights would make convolutions grouped ones,
XLA's slow path, so ``vmap`` and ``chunked`` trace their clients inside
:func:`fedsim.models.vmapped_instances` (im2col GEMMs); loop and chunked then
came within 10 % of each other at 500 and 1,000 LeNet-5 clients
(``benchmarks/results/engine_throughput.md``).

Randomness: ``key = jax.random.key(seed)``; the model is initialised from
``fold_in(key, 0)``; round r uses ``fold_in(fold_in(key, 1), r)``, split into a
sampling key and a client key, and client c trains with
``fold_in(client_key, c)``. A round's randomness therefore depends only on
(seed, round, client), which makes strategies comparable and runs resumable.
Work beside a run that needs keys of its own takes them from
:func:`fedsim.keys.experiment_key`, never from ``split(key)``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from collections.abc import Mapping
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedsim import distributed, keys, memory, models
from fedsim import partition as partition_lib
from fedsim.client import LocalTraining, init_client_state, make_client_update
from fedsim.config import Config, ConfigError, server_hyperparameters
from fedsim.data import Dataset, DatasetError, load_dataset
from fedsim.hooks import (DEFENSE_REGISTRY, SIMULATION_PLUGINS, Defense, _load_defenses,
                          build_defense, build_mask, chain, check_stage_compatibility,
                          mask_around, mask_defense, reconfigure_mask)
from fedsim.keys import ENGINE_INIT, ENGINE_ROUNDS
from fedsim.models import (build_model, has_batch_norm, init_params, make_apply_fn,
                           make_eval_fn, make_train_fn, running_stats_mask)
from fedsim.observer import ObservedUpload
from fedsim.server import (add_weight, add_weights, make_server_optimizer, mean_update,
                           sample_cohort_order, server_update, weighted_sum, zero_total)
from fedsim.typing import ClientOutput, CohortData, Observation, ServerState
from fedsim.x64 import x64_invariant


class NonFiniteError(RuntimeError):
    """A client's loss or update was NaN/Inf; the message names round and client."""


@dataclasses.dataclass
class RoundResult:
    """Host-side summary of one round."""

    round: int
    cohort: np.ndarray
    train_loss: float  # example-weighted mean over the clients counted; NaN if none was
    seconds: float
    skipped_clients: list[int]
    observed: list[ObservedUpload]


def make_client_optimizer(t) -> optax.GradientTransformation:
    """The client optimizer named by a :class:`~fedsim.config.TrainingConfig`.

    Wrapped by :func:`fedsim.x64.x64_invariant`, so that a float32 run gives the
    same numbers whether or not ``jax_enable_x64`` is on.
    """
    return x64_invariant(_client_optimizer(t))


def _client_optimizer(t) -> optax.GradientTransformation:
    if t.optimizer == "sgd":
        tx = optax.sgd(t.lr)
    elif t.optimizer == "momentum":
        tx = optax.sgd(t.lr, momentum=t.momentum)
    elif t.optimizer == "adam":
        tx = optax.adam(t.lr)
    elif t.optimizer == "adamw":
        return optax.adamw(t.lr, weight_decay=t.weight_decay)
    else:  # validated by the config
        raise ConfigError(f"unknown training.optimizer {t.optimizer!r}")
    if t.weight_decay > 0:
        tx = optax.chain(optax.add_decayed_weights(t.weight_decay), tx)
    return tx


#: A defense spec's keys that say how to load the ``dataset`` it names, and the
#: run's settings they default to where it names the run's own dataset.
RUN_DATA_KEYS = {"source": lambda cfg: cfg.data.source,
                 "data_dir": lambda cfg: cfg.data.data_dir,
                 "dataset_seed": lambda cfg: cfg.seed,
                 "image_size": lambda cfg: cfg.data.image_size,
                 "normalize": lambda cfg: cfg.data.normalize}


def on_run_data(specs: list[dict], cfg: Config) -> list[dict]:
    """``specs`` with a defense that names the run's dataset loading it as the run does.

    A data-space channel (paper 000) calibrates its noise on Σ_D of the dataset
    its spec names. Where that is ``cfg.data.dataset``, the keys of
    :data:`RUN_DATA_KEYS` the defense takes and the spec leaves out come from
    the run: otherwise Σ_D could describe other inputs than those it protects
    (the ``synthetic`` dataset of seed 0 under a run of another seed, raw
    inputs under ``data.normalize: true``). Keys the spec sets are kept.
    """
    import inspect

    out = []
    for spec in specs:
        spec = dict(spec)
        name = spec.get("name")  # build_defenses names a bad one
        factory = DEFENSE_REGISTRY.get(name) if isinstance(name, str) else None
        if factory is not None and spec.get("dataset") == cfg.data.dataset:
            takes = inspect.signature(factory).parameters
            for key, setting in RUN_DATA_KEYS.items():
                if key in takes and key not in spec:
                    spec[key] = setting(cfg)
        out.append(spec)
    return out


def _check_dataset_fits_config(ds: Dataset, data_cfg) -> None:
    """Refuse a preloaded dataset whose image size is not the config's ``data.image_size``.

    The run trains on the dataset's images, but what reads the config describes
    them by ``data.image_size``: a channel calibrated on the run's data
    (:func:`on_run_data`) would be built for the config's size, and the results
    and checkpoints would record a size the run never used.

    Raises:
      ConfigError: naming both sizes.
    """
    size = data_cfg.image_size
    if size is None:
        return
    hw = tuple(ds.input_shape[:2])
    if hw != (size, size):
        raise ConfigError(f"config key 'data.image_size' ({size}) does not match the dataset "
                          f"given to Simulation(dataset=...), whose images are "
                          f"{hw[0]}x{hw[1]}: set data.image_size to {hw[0]} if the images are "
                          "square, or null, or load the dataset at the config's size")


def _check_defense_mapping(defenses) -> None:
    """Refuse a ``Simulation(defenses=...)`` that is not ``{stage: Defense}`` with each
    Defense under its own stage.

    A list or a spec used to fail in ``dict()`` with a message naming neither;
    a Defense under another stage's key would have run at that stage.

    Raises:
      TypeError: for anything but a mapping of stages to :class:`Defense`.
      ValueError: for a Defense under a key other than its ``stage``.
    """
    if not isinstance(defenses, Mapping) or not all(
            isinstance(d, Defense) for d in defenses.values()):
        raise TypeError(f"Simulation(defenses=...) takes a mapping {{stage: Defense}}, e.g. "
                        f"{{d.stage: d}} for d = dp_gaussian(1.0) (several of one stage: "
                        f"fedsim.hooks.chain); got {type(defenses).__name__}")
    for stage, d in defenses.items():
        if stage != d.stage:
            raise ValueError(f"Simulation(defenses=...): {d.name!r} acts at stage "
                             f"{d.stage!r} but was given under {stage!r}")


def build_defenses(specs: list[dict]) -> dict[str, Defense]:
    """Build the config's defenses, chained per stage in config order."""
    by_stage: dict[str, list[Defense]] = {}
    for i, spec in enumerate(specs):
        spec = dict(spec)
        name = spec.pop("name")
        where = f"config key 'defenses[{i}]'"
        try:
            d = build_defense(name, **spec)
        except ValueError as e:
            raise ConfigError(f"{where}: {e}") from None
        except DatasetError as e:  # a channel's own dataset: its spec's keys, not data.*
            raise ConfigError(f"{where} ({name}): cannot load the dataset its spec names "
                              f"(dataset, source, data_dir there): {e}") from None
        by_stage.setdefault(d.stage, []).append(_naming_errors(d, f"{where} ({name})"))
    try:
        built = {s: (ds[0] if len(ds) == 1 else chain(*ds)) for s, ds in by_stage.items()}
        check_stage_compatibility(built)
    except ValueError as e:
        raise ConfigError(f"config key 'defenses': {e}") from None
    return built


def _defenses_around(own: dict[str, Defense], mask) -> dict[str, Defense]:
    """``own`` with the global pruning ``mask`` around the layer and upload stages
    (:func:`fedsim.hooks.mask_around`; :func:`~fedsim.hooks.mask_defense` where the
    config has no defense of that stage)."""
    defenses = dict(own)
    for stage in ("layer", "upload"):
        defenses[stage] = (mask_around(mask, own[stage]) if stage in own
                           else mask_defense(mask, stage))
    return defenses


def _local_training(defenses: dict[str, Defense]) -> Callable | None:
    """The ``client_update_factory`` a defense brings (``Defense.local_training``), if any.

    Raises:
      ConfigError: two stages' defenses each bring one.
    """
    own = {s: d for s, d in defenses.items() if d.local_training is not None}
    if len(own) > 1:
        raise ConfigError("config key 'defenses': " + " and ".join(
            f"{d.name!r} ({s})" for s, d in own.items()) + " each bring their own local "
            "training; a run can use only one")
    return next(iter(own.values())).local_training if own else None


def _naming_errors(d: Defense, where: str) -> Defense:
    """``d`` whose ``ValueError``s name the config entry that built it.

    Some settings can only be checked against the model or the data, when the
    defense first runs (while the round step is traced): a Soteria layer the
    model does not have, a channel calibrated for another input shape. Their
    message is clear, but it would come as a traceback out of JAX's tracing
    with no word of which config entry it was.
    """
    def named(fn):
        if fn is None:
            return None

        @functools.wraps(fn)
        def call(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except ConfigError:
                raise
            except ValueError as e:
                raise ConfigError(f"{where}: {e}") from e
        return call

    return d._replace(init=named(d.init), apply=named(d.apply), begin_round=named(d.begin_round),
                      end_round=named(d.end_round))


def partition_dataset(cfg: Config, ds: Dataset) -> list[np.ndarray]:
    d = cfg.data
    if d.partition == "iid":
        return partition_lib.iid(ds.y_train, d.num_clients, cfg.seed)
    if d.partition == "dirichlet":
        return partition_lib.dirichlet(ds.y_train, d.num_clients, d.alpha, cfg.seed)
    if d.partition == "shards":
        return partition_lib.shards(ds.y_train, d.num_clients, d.classes_per_client, cfg.seed,
                                    d.examples_per_client)
    return partition_lib.natural(ds.groups, d.num_clients, cfg.seed)


class Simulation:
    """A federated simulation built from a :class:`~fedsim.config.Config`.

    Args:
      cfg: the validated config.
      dataset: a preloaded dataset (else loaded from ``cfg.data``).
      defenses: stage -> Defense, in place of ``cfg.defenses`` (else built
        from it). Giving both is refused: the config's would not run, yet
        what reads the config (the channels' leakage ledger) would describe
        them.
      strategy: overrides ``cfg.training.client_parallelism``.
      donate: donate the server state's buffers to the round step (saves a
        copy of the model per round; the ``state`` passed to
        :meth:`run_round` is then invalid afterwards).
      client_update_factory: replaces :func:`fedsim.client.make_client_update`
        (same signature) for local training that the stage hooks cannot
        express, e.g. PriPrune's joint steps on weights and mask parameters.
        Without it, a defense that brings its own (``Defense.local_training``,
        as the registered ``priprune`` does) supplies it.

    With several processes (:mod:`fedsim.distributed`), ``auto`` becomes
    ``sharded``.

    Raises:
      fedsim.distributed.DistributedError: with several processes, their
        configs differ, or the strategy cannot spread a cohort over them.
    """

    def __init__(self, cfg: Config, dataset: Dataset | None = None,
                 defenses: dict[str, Defense] | None = None, strategy: str | None = None,
                 donate: bool = False, client_update_factory: Callable | None = None):
        if not isinstance(cfg, Config):
            raise TypeError(f"Simulation needs a fedsim.config.Config (fedsim.config.load_config "
                            f"builds one), got {type(cfg).__name__}")
        if defenses is not None:
            _check_defense_mapping(defenses)
        # Before this simulation compiles its programs: a process that builds many
        # (a reproduction script, a notebook) would otherwise keep every earlier
        # one's until XLA segfaults at the kernel's mapping limit. The line, if
        # any, goes to the run log (fedsim.run).
        self.memory_note = memory.release_compiled_programs_near_map_limit(
            "building a simulation")
        self.cfg = cfg
        self.donate = donate
        d, t = cfg.data, cfg.training
        ds = dataset if dataset is not None else load_dataset(
            d.dataset, image_size=d.image_size, source=d.source, data_dir=d.data_dir,
            max_train=d.max_train, max_test=d.max_test, label_key=d.label_key, seed=cfg.seed)
        if dataset is not None:
            _check_dataset_fits_config(ds, d)
        if d.normalize:
            ds = dataclasses.replace(ds, x_train=(ds.x_train - ds.mean) / ds.std,
                                     x_test=(ds.x_test - ds.mean) / ds.std)
        if t.dtype == "float64":
            check_float64(cfg)
            ds = dataclasses.replace(ds, x_train=np.asarray(ds.x_train, np.float64),
                                     x_test=np.asarray(ds.x_test, np.float64))
        self.dataset = ds
        try:
            parts = partition_dataset(cfg, ds)
        except ValueError as e:
            raise ConfigError(f"config key 'data.partition' ({d.partition}): {e}") from None
        if d.examples_per_client is not None and d.partition != "shards":
            parts = [p[: d.examples_per_client] for p in parts]
        idx, counts = partition_lib.pad_indices(parts)
        self.partitions = parts
        self.num_clients = len(parts)
        self.n_max = idx.shape[1]
        self.client_counts = counts
        self.model = build_model(cfg.model.name, ds.num_classes)
        #: ``apply_fn(params, x)``: the model as clients train it and the observer's
        #: attacks see it (batch norm: training mode, the batch's statistics).
        self.apply_fn = make_apply_fn(self.model)
        #: ``eval_fn(params, x)``: the model as the server evaluates it (batch norm:
        #: the running statistics); ``apply_fn`` for a model without batch norm.
        self.eval_fn = make_eval_fn(self.model)
        _check_model_fits(self.model, cfg.model.name, ds.input_shape)
        self.key = jax.random.key(cfg.seed)
        #: Whether the model has batch norm (:class:`fedsim.models.BatchNorm`).
        self.batch_norm = has_batch_norm(jax.eval_shape(self._initial_params))
        if self.batch_norm and cfg.pruning.scheme is not None:
            raise ConfigError(f"config key 'pruning.scheme' ({cfg.pruning.scheme}): model "
                              f"{cfg.model.name!r} has batch norm, whose running statistics "
                              "are not weights to prune; use a model without batch norm")
        _load_defenses()  # the registry on_run_data reads
        if defenses is not None and cfg.defenses:
            names = ", ".join(str(spec.get("name")) for spec in cfg.defenses)
            raise ConfigError(
                f"config key 'defenses' names {names} but Simulation(defenses=...) was given "
                "too; the config's would not run. Pass one or the other (an empty "
                "'defenses' in the config with defenses=, or no defenses=)")
        #: The defense specs as built: the config's, on the run's data (on_run_data);
        #: empty when the defenses were given by hand.
        self.defense_specs = on_run_data(cfg.defenses, cfg)
        self.defenses = build_defenses(self.defense_specs) if defenses is None else dict(defenses)
        #: Whether the defenses came from ``defenses=``, which the config (and so
        #: the checkpoint's config fingerprint) does not describe.
        self.defenses_by_hand = defenses is not None
        for defense in self.defenses.values():
            for check in defense.config_checks:
                check(cfg)
        self._own_defenses = dict(self.defenses)  # before a pruning mask goes around them
        self.global_mask = None
        if cfg.pruning.scheme is not None:
            self._prune()
        self.settings = LocalTraining(t.algorithm, t.local_epochs, t.batch_size, self.n_max,
                                      unroll_steps=t.unroll_steps)
        self.client_tx = make_client_optimizer(t) if t.algorithm == "fedavg" else optax.sgd(t.lr)
        self.server_tx = make_server_optimizer(t.server_optimizer, t.server_lr,
                                               **server_hyperparameters(t))
        if self.batch_norm:
            # The running statistics take the clients' mean as it is (FedAvg of
            # statistics); the server optimizer steps the weights only.
            self.server_tx = optax.multi_transform(
                {"weights": self.server_tx, "running_stats": optax.sgd(1.0)},
                lambda params: jax.tree_util.tree_map(
                    lambda stat: "running_stats" if stat else "weights",
                    running_stats_mask(params)))
        self._client_update_factory = client_update_factory
        self._build_client_update()
        self.strategy = strategy or t.client_parallelism
        self.strategy_reason = f"client_parallelism={self.strategy} (fixed by config)"
        distributed.check_same_config(cfg)
        across = distributed.check_strategy(self.strategy)
        if across is not None and self.strategy == "auto":
            self.strategy = across
            self.strategy_reason = (f"client_parallelism=auto: sharded, the one strategy that "
                                    f"spreads a cohort over {distributed.process_count()} "
                                    "processes (not timed)")
        self.mesh = None
        # Device-resident data; the engine gathers client slices inside jit.
        # _place_data puts the training data where self.strategy needs it.
        self._host_data = (ds.x_train, ds.y_train, idx)
        self._device_data = self._mesh_data = self._placement = None
        self._x_test = jnp.asarray(ds.x_test)
        self._y_test = jnp.asarray(ds.y_test)
        self.round_callbacks: list[Callable[[int, dict], dict]] = []
        if self.strategy == "auto":
            from fedsim import calibrate
            self.strategy, self.strategy_reason = calibrate.choose_strategy(self)
            self._compile(reuse=True)  # the winner's executables from calibration
            # Calibration may have placed the data both ways: keep the winner's copy.
            if self.strategy == "sharded":
                self._device_data = None
            else:
                self._mesh_data = None
        else:
            self._compile()
        for plugin in SIMULATION_PLUGINS:
            plugin(self)

    # --- setup -------------------------------------------------------------

    def numerics(self):
        """Context for the simulation's computations: ``training.matmul_precision``.

        Entered by :meth:`run_round`, :meth:`evaluate` and calibration, so the
        jitted steps are traced (and cached) under it. On a GPU, JAX's own
        default lets float32 products run in TF32; this engine defaults to
        "highest" so that float32 means float32 on every backend.
        """
        return jax.default_matmul_precision(self.cfg.training.matmul_precision)

    def _initial_params(self):
        """The model at round 0 (before any global mask).

        Under ``training.dtype`` float64 the float32 initialisation cast: the
        same starting model as the float32 run, so the two differ by rounding
        only.
        """
        params = init_params(self.model, self.dataset.input_shape,
                             jax.random.fold_in(self.key, ENGINE_INIT))
        if self.cfg.training.dtype == "float32":
            return params
        return jax.tree_util.tree_map(
            lambda a: a.astype(jnp.float64) if jnp.issubdtype(a.dtype, jnp.floating) else a,
            params)

    def _build_client_update(self) -> None:
        """``self.client_update`` from the factory given, a defense's own, or the engine's."""
        try:
            self.client_update = self._make_client_update(self.defenses)
        except ValueError as e:
            if self._client_update_factory is not None:  # the caller's own: not the config's
                raise
            # A defense's own local training refusing the config's other defenses.
            raise ConfigError(f"config key 'defenses': {e}") from None

    def _make_client_update(self, defenses: dict[str, Defense]) -> Callable:
        factory = self._client_update_factory or _local_training(defenses)
        if self.batch_norm:
            if factory is not None:
                raise ConfigError(
                    f"model {self.cfg.model.name!r} has batch norm, which the local training "
                    "of a defense that brings its own (PriPrune) or of a client_update_factory "
                    "does not update; use a model without batch norm")
            train_fn = make_train_fn(self.model)
            return make_client_update(self.apply_fn, self.client_tx, self.settings, defenses,
                                      batch_norm_train_fn=train_fn)
        if factory is None:
            factory = make_client_update
        return factory(self.apply_fn, self.client_tx, self.settings, defenses)

    def _client_update_around(self, gmask) -> Callable:
        """The client update with the global mask ``gmask`` (a traced argument of
        the compiled steps; ``()`` without pruning) around the config's defenses.

        Built while the step traces, so the mask is an input of the compiled
        step, not a constant in it: a reconfiguration does not compile again,
        and a large model's mask is not written into the program (a 9M-weight
        VGG-11 mask made its HLO ~74 MB; benchmarks/pruned_round_step.py).
        """
        if not jax.tree_util.tree_leaves(gmask):
            return self.client_update
        return self._make_client_update(_defenses_around(self._own_defenses, gmask))

    def _prune(self) -> None:
        """Pruned FL from ``cfg.pruning`` (paper 002, Chu et al. 2023, Alg 1).

        The server computes the base scheme's global mask m once, on the
        initial model (:func:`fedsim.hooks.build_mask`; SNIP and GraSP score it
        on ``pruning.examples`` training examples drawn with the run's
        ``pruning/examples`` stream, a simulation shortcut for a server that
        would hold data of its own). From then on the model starts as w ⊙ m,
        every local step's gradient and every upload are multiplied by m
        before and after the config's own defenses of those stages
        (:func:`fedsim.hooks.mask_defense`), and so the server's average stays
        masked (Alg 1 line 11).
        With ``pruning.reconfigurations`` K > 1 (an iterative scheme: PruneFL,
        FedDST) the server makes the mask again at rounds E, 2E, ...,
        (K − 1)E (E = ``pruning.reconfigure_every``), on the global model it
        holds then (:meth:`_reconfigure`); the current mask is carried in
        ``ServerState.mask`` and the global model is masked after every round's
        server step, so that no server optimizer state can bring a weight pruned
        by a later mask back. With K = 1 the mask is fixed; PruneFL and FedDST
        then take their first step at once
        (:func:`defenses.pruning.schemes.one_shot_mask`).

        Raises:
          ConfigError: the scheme cannot build its mask, naming ``pruning``.
        """
        pc, ds = self.cfg.pruning, self.dataset
        rng = keys.numpy_generator(self.cfg.seed, "pruning/examples")
        pick = np.sort(rng.choice(len(ds.y_train), min(pc.examples, len(ds.y_train)),
                                  replace=False))
        extra = {"reconfigurations": pc.reconfigurations} if pc.reconfigurations > 1 else {}
        try:
            mask = build_mask(pc.scheme, self._initial_params(), pc.p,
                              key=keys.experiment_key(self.cfg.seed, "pruning/mask"),
                              apply_fn=self.apply_fn, x=jnp.asarray(ds.x_train[pick]),
                              y=jnp.asarray(ds.y_train[pick]), input_shape=ds.input_shape,
                              synflow_iterations=pc.synflow_iterations, **extra)
        except ValueError as e:
            raise ConfigError(f"config key 'pruning' ({pc.scheme}): {e}") from None
        self._use_mask(mask)

    def _use_mask(self, mask) -> None:
        """Put ``mask`` around the layer and upload defenses (before and after the config's own)."""
        # A copy of its own: the mask a state carries (a restored one, or the
        # state's after a reconfiguration) is donated to the round step with it,
        # and the mask the step takes as its own input (_mask_arg) must outlive that.
        self.global_mask = jax.tree_util.tree_map(
            lambda m: jnp.array(m, dtype=jnp.float32, copy=True), mask)
        self.defenses = _defenses_around(self._own_defenses, self.global_mask)
        self._placed_mask = None  # the round step's copy (_mask_arg)

    def _mask_arg(self):
        """The global mask as the compiled steps take it: ``()`` without pruning;
        replicated over the mesh for the sharded strategy."""
        if self.global_mask is None:
            return ()
        placed = self.__dict__.get("_placed_mask")
        if placed is None or placed[0] is not self.mesh:
            if self.mesh is not None:
                from fedsim import sharding
                arg = sharding.replicate(self.mesh, self.global_mask)
            else:
                arg = self.global_mask
            placed = self._placed_mask = (self.mesh, arg)
        return placed[1]

    @property
    def _mask_in_state(self) -> bool:
        """Whether the mask changes during the run (and so is carried in the state)."""
        pc = self.cfg.pruning
        return pc.scheme is not None and pc.reconfigurations > 1

    def reconfiguration_at(self, round_idx: int) -> int | None:
        """k if the server re-makes the mask before round ``round_idx`` (k ≥ 1), else None."""
        pc = self.cfg.pruning
        if not self._mask_in_state or round_idx == 0:
            return None
        k, rest = divmod(round_idx, pc.reconfigure_every)
        return k if rest == 0 and k < pc.reconfigurations else None

    def _reconfigure(self, state: ServerState, k: int) -> ServerState:
        """Reconfiguration ``k``: the scheme's new mask on the global model, and
        the model masked with it. The compiled steps take the mask as an input,
        so nothing compiles again."""
        pc = self.cfg.pruning
        key = jax.random.fold_in(keys.experiment_key(self.cfg.seed, "pruning/reconfigure"), k)
        mask = reconfigure_mask(pc.scheme, state.params, state.mask, pc.p, k=k,
                                num=pc.reconfigurations, key=key)
        self._set_mask(mask)
        return state._replace(params=_apply_mask(state.params, self.global_mask),
                              mask=_copy(self.global_mask))

    def _set_mask(self, mask) -> None:
        self._use_mask(mask)
        self._build_client_update()  # the one outside the compiled steps (same shapes)

    def adopt(self, state: ServerState) -> None:
        """Take the mask a restored ``state`` carries (a run resumed after a
        reconfiguration); nothing to do for any other state."""
        if not self._mask_in_state or not jax.tree_util.tree_leaves(state.mask):
            return
        same = all(bool(jnp.array_equal(a, b)) for a, b in zip(
            jax.tree_util.tree_leaves(state.mask), jax.tree_util.tree_leaves(self.global_mask)))
        if not same:
            self._set_mask(state.mask)

    def use_global_mask(self, mask, state: ServerState) -> ServerState:
        """Pruned FL from Python with a global mask of your own (paper 002, Alg 1).

        What ``cfg.pruning`` does with a scheme's mask, for a mask made
        anywhere: from the next round on, ``mask`` goes around the layer and
        upload defenses (:func:`fedsim.hooks.mask_around`; a Pseudo-Pruning
        start model included) as an input of the compiled steps, so a new mask
        compiles nothing again and a large model's mask is not written into the
        program (``benchmarks/results/pruned_round_step.md``). The returned
        state holds w ⊙ m and carries m, so the global model is masked after
        every server step (Alg 1 line 11): no server optimizer state brings a
        pruned weight back. Call it again with the next mask at a
        reconfiguration (PruneFL, FedDST); the defenses' client states are
        kept. A state restored from a checkpoint carries its mask, but a new
        ``Simulation`` does not know it: call
        ``use_global_mask(state.mask, state)`` on it again.

        Args:
          mask: a pytree like the params with values in {0, 1} (1 = kept).
          state: the server state to go on from.

        Returns:
          ``state`` with its params masked and ``mask`` carried.

        Raises:
          ConfigError: ``cfg.pruning.scheme`` is set (the config makes the masks).
          ValueError: the mask's structure or a leaf's shape differs from the
            params', or a value is not 0 or 1 (NaN included).
        """
        if self.cfg.pruning.scheme is not None:
            raise ConfigError(f"config key 'pruning.scheme' ({self.cfg.pruning.scheme}): the "
                              "config makes the global masks; use_global_mask is for a run "
                              "without pruning.scheme")
        _check_global_mask(mask, state.params)
        self._set_mask(mask)
        # A stage the run had no defense at now has the mask's (stateless) one.
        added = {s: d for s, d in self.defenses.items() if s not in state.client_states}
        return state._replace(params=_apply_mask(state.params, self.global_mask),
                              client_states={**state.client_states,
                                             **self._client_states(added, state.params)},
                              mask=_copy(self.global_mask))

    def init_state(self) -> ServerState:
        """The initial server state: fresh model, optimizer, per-client states.

        With ``cfg.pruning`` the model is masked (w ⊙ m).
        """
        params = self._initial_params()
        if self.global_mask is not None:
            params = _apply_mask(params, self.global_mask)
        return ServerState(params, self.server_tx.init(params), jnp.zeros((), jnp.int32),
                           self._client_states(self.defenses, params),
                           _copy(self.global_mask) if self._mask_in_state else ())

    def _client_states(self, defenses: dict[str, Defense], params) -> dict:
        """Every client's initial state of ``defenses`` (a leading client axis)."""
        one = init_client_state(defenses, params)
        return jax.tree_util.tree_map(
            lambda s: jnp.broadcast_to(s, (self.num_clients,) + jnp.shape(s)).copy(), one)

    def round_keys(self, round_idx: int):
        rk = jax.random.fold_in(jax.random.fold_in(self.key, ENGINE_ROUNDS), round_idx)
        return jax.random.split(rk)

    def cohort(self, round_idx: int) -> np.ndarray:
        """The clients of round ``round_idx`` (observed clients forced in)."""
        sample_key, _ = self.round_keys(round_idx)
        order = np.asarray(sample_cohort_order(sample_key, self.num_clients,
                                               self.cfg.training.clients_per_round))
        obs = self.cfg.observer
        if round_idx in obs.rounds and obs.clients:
            # The rest of the cohort: the first others of the draw in its random
            # order, a uniform sample of the other clients. "sorted_cut" cuts the
            # sorted draw instead, dropping the largest ids (high ids train less
            # in observed rounds); runs recorded before it became a choice did so.
            targets = list(obs.clients)
            others = order if obs.fill == "uniform" else np.sort(order)
            rest = [c for c in others if c not in targets]
            return np.sort(np.array(targets + rest[: len(order) - len(targets)], dtype=np.int32))
        return np.sort(order)

    def client_data(self, cid) -> CohortData:
        """One client's padded data (jit-friendly gather)."""
        return _gather(self._x, self._y, self._idx, cid)

    # --- compiled pieces ---------------------------------------------------

    # The jitted pieces that do not depend on the strategy, and the one that does.
    _SHARED_JITTED = ("_run_client", "_run_and_accumulate", "_run_and_accumulate_many",
                      "_accumulate", "_finish", "_evaluate", "_server_state_finite")

    def _compile(self, reuse: bool = False):
        """(Re)build the jitted pieces for ``self.strategy``.

        Args:
          reuse: keep the jitted functions earlier calls built since the last
            plain ``_compile()`` (the shared ones, and the cohort step of a
            strategy built before), so the executables compiled through them
            are not compiled again. Calibration builds every candidate and
            then the winner this way; without it the winner compiled twice
            (~1 min for the quickstart's ``loop`` on a 2-core CPU). Only valid while nothing
            they close over (client update, data shapes, defenses) has changed;
            a plain ``_compile()`` rebuilds everything.
        """
        self._place_data()
        built = self.__dict__.setdefault("_jitted", {})
        if not reuse:
            built.clear()
        if reuse and "shared" in built and (self.strategy == "loop"
                                            or self.strategy in built):
            for name, fn in built["shared"].items():
                setattr(self, name, fn)
            if self.strategy != "loop":
                self._cohort_step = built[self.strategy]
            return
        shared = built.get("shared")
        self._build_jitted()
        if shared is not None:  # keep the shared pieces' compiled executables
            for name, fn in shared.items():
                setattr(self, name, fn)
        built["shared"] = {name: getattr(self, name) for name in self._SHARED_JITTED}
        if self.strategy != "loop":
            built[self.strategy] = self._cohort_step

    def _place_data(self):
        """The training data (and ``self.mesh``) where ``self.strategy`` needs them.

        ``sharded`` replicates the data over a mesh of every device; the other
        strategies run on one device. Each copy is made from the host arrays
        the first time it is needed and kept, so that ``auto`` can time
        ``sharded`` beside the others (several devices, one process); once it
        has chosen, the copy the choice does not use is dropped.
        """
        placement = "mesh" if self.strategy == "sharded" else "device"
        if placement == self._placement:
            return  # already there (and self._x etc. as the caller may have set them)
        self._placement = placement
        if placement == "mesh":
            if self._mesh_data is None:
                from fedsim import sharding
                self._client_mesh = sharding.client_mesh()
                self._mesh_data = sharding.replicate(self._client_mesh, self._host_data)
            self.mesh = self._client_mesh
            self._x, self._y, self._idx = self._mesh_data
        else:
            if self._device_data is None:
                self._device_data = tuple(jnp.asarray(a) for a in self._host_data)
            self.mesh = None
            self._x, self._y, self._idx = self._device_data

    def _build_jitted(self):
        client_update_around = self._client_update_around
        strategy = self.strategy  # fixed at build time: a reused cohort step may be retraced
        weighting = self.cfg.training.weighting
        aggregation = self.cfg.training.aggregation

        def run_client(params, gmask, x_all, y_all, idx_all, cid, cstate, ckey):
            data = _gather(x_all, y_all, idx_all, cid)
            out = client_update_around(gmask)(params, data, cstate, jax.random.fold_in(ckey, cid))
            finite = _all_finite(out.update) & jnp.isfinite(out.loss)
            weight = out.num_examples if weighting == "examples" else jnp.ones_like(out.num_examples)
            weight = jnp.where(finite, weight, 0.0)
            update = jax.tree_util.tree_map(lambda u: jnp.where(finite, u, 0.0), out.update)
            # A skipped client leaves the round as if it had not taken part: its
            # new defense state came out of the same diverged training, and a
            # stored NaN (Pseudo-Pruning's withheld weights, PriPrune's α) would
            # make it NaN in every later round it is sampled in. Selecting here
            # covers every strategy: all of them train a client through this.
            kept = jax.tree_util.tree_map(lambda n, o: jnp.where(finite, n, o),
                                          out.client_state, cstate)
            return out._replace(update=update, num_examples=weight, client_state=kept), finite

        self._run_client = jax.jit(run_client)

        def run_and_accumulate(params, gmask, wsum, wtot, x_all, y_all, idx_all, cid, cstates,
                               ckey):
            # The loop strategy's per-client step: one dispatch, no host sync.
            cs = jax.tree_util.tree_map(lambda s: s[cid], cstates)
            out, fin = run_client(params, gmask, x_all, y_all, idx_all, cid, cs, ckey)
            wsum = jax.tree_util.tree_map(lambda s, u: s + out.num_examples * u, wsum, out.update)
            wtot = add_weight(wtot, out.num_examples, out.update, aggregation)
            return wsum, wtot, out._replace(update=None), fin

        self._run_and_accumulate = jax.jit(run_and_accumulate, donate_argnums=(2, 3))

        def run_and_accumulate_many(params, gmask, wsum, wtot, x_all, y_all, idx_all, cids,
                                    cstates, ckey):
            # ``len(cids)`` clients one after another in one call (Python-unrolled,
            # same summation order as one call per client): fewer dispatches, and
            # XLA:CPU can overlap independent clients' ops across cores.
            outs, fins = [], []
            for i in range(cids.shape[0]):
                wsum, wtot, out, fin = run_and_accumulate(params, gmask, wsum, wtot, x_all,
                                                          y_all, idx_all, cids[i], cstates, ckey)
                outs.append(out)
                fins.append(fin)
            stack = lambda *a: jnp.stack(a)
            return wsum, wtot, jax.tree_util.tree_map(stack, *outs), jnp.stack(fins)

        self._run_and_accumulate_many = jax.jit(run_and_accumulate_many, donate_argnums=(2, 3))

        def finish(state, wsum, wtot, ids, new_cstates):
            mean = mean_update(wsum, wtot)
            params, opt_state = server_update(self.server_tx, state.params, state.opt_state, mean)
            # No upload counted (every client skipped for a NaN/Inf): no aggregate,
            # so no server step. A zero pseudo-gradient is not one: momentum, Adam
            # and Yogi still step from their state (and Adam counts the step).
            # ``wtot`` is the scalar total (mean) or the per-coordinate totals
            # (sender_mean), each > 0 only where a counted client contributed.
            counted = jnp.any(jnp.stack([jnp.any(t > 0)
                                         for t in jax.tree_util.tree_leaves(wtot)]))
            params, opt_state = jax.tree_util.tree_map(
                lambda n, o: jnp.where(counted, n, o), (params, opt_state),
                (state.params, state.opt_state))
            cs = jax.tree_util.tree_map(lambda a, n: a.at[ids].set(n), state.client_states,
                                        new_cstates)
            cs = _end_round(self.defenses, cs, ids, new_cstates, counted)
            if jax.tree_util.tree_leaves(state.mask):  # a mask that changes: Alg 1 line 11
                params = _apply_mask(params, state.mask)
            return ServerState(params, opt_state, state.round + 1, cs, state.mask)

        # Clients vmapped in groups of more than one: fedsim's Conv layers take im2col
        # there (XLA:CPU runs a conv with a per-client kernel as a grouped conv; see
        # benchmarks/results/vmapped_conv_cpu.md). ``map`` vmaps one client at a time,
        # an ordinary convolution. Entered inside cohort_step: read while jit traces.
        group = 1 if strategy == "map" else (self.cfg.training.chunk_size
                                             if strategy == "chunked" else None)
        vectorised = (contextlib.nullcontext if group == 1 else models.vmapped_instances)

        def cohort_step(state, gmask, x_all, y_all, idx_all, ids, ckey):
            with vectorised():
                return vectorised_cohort_step(state, gmask, x_all, y_all, idx_all, ids, ckey)

        def vectorised_cohort_step(state, gmask, x_all, y_all, idx_all, ids, ckey):
            cstates = jax.tree_util.tree_map(lambda s: s[ids], state.client_states)
            one = lambda cid, cs: run_client(state.params, gmask, x_all, y_all, idx_all, cid, cs,
                                             ckey)
            if strategy == "vmap":
                outs, finite = jax.vmap(one)(ids, cstates)
                wsum = weighted_sum(outs.update, outs.num_examples)
                wtot = add_weights(zero_total(state.params, aggregation), outs.num_examples,
                                   outs.update, aggregation)
            else:
                zeros = jax.tree_util.tree_map(jnp.zeros_like, state.params)
                k = 1 if strategy == "map" else self.cfg.training.chunk_size
                C = ids.shape[0]
                pad = (-C) % k
                ids_p = jnp.concatenate([ids, jnp.repeat(ids[:1], pad)])
                valid = jnp.arange(C + pad) < C
                cs_p = jax.tree_util.tree_map(
                    lambda s: jnp.concatenate([s, jnp.repeat(s[:1], pad, axis=0)]), cstates)
                chunks = (ids_p.reshape(-1, k), valid.reshape(-1, k),
                          jax.tree_util.tree_map(lambda s: s.reshape((-1, k) + s.shape[1:]), cs_p))

                def body(carry, chunk):
                    wsum, wtot = carry
                    cids, ok, cs = chunk
                    outs, fin = jax.vmap(one)(cids, cs)
                    w = outs.num_examples * ok
                    wsum = jax.tree_util.tree_map(jnp.add, wsum, weighted_sum(outs.update, w))
                    wtot = add_weights(wtot, w, outs.update, aggregation)
                    return (wsum, wtot), (outs._replace(update=None), fin)

                (wsum, wtot), (outs, finite) = jax.lax.scan(
                    body, (zeros, zero_total(state.params, aggregation)), chunks)
                flat = lambda a: a.reshape((-1,) + a.shape[2:])[:C]
                outs = jax.tree_util.tree_map(flat, outs)
                finite = flat(finite)
            new_state = finish(state, wsum, wtot, ids, outs.client_state)
            return new_state, outs.loss, outs.num_examples, finite

        if self.strategy == "sharded":
            from fedsim import sharding
            self._cohort_step = jax.jit(
                sharding.sharded_cohort_step(run_client, finish, self.mesh, aggregation),
                donate_argnums=(0,) if self.donate else ())
        elif self.strategy != "loop":
            self._cohort_step = jax.jit(cohort_step, donate_argnums=(0,) if self.donate else ())
        self._accumulate = jax.jit(lambda wsum, wtot, u, w: (
            jax.tree_util.tree_map(lambda s, x: s + w * x, wsum, u),
            add_weight(wtot, w, u, aggregation)))
        self._finish = jax.jit(finish, donate_argnums=(0,) if self.donate else ())

        eval_bs = min(self.cfg.eval.batch_size, len(self.dataset.y_test))

        def evaluate(params, x, y):
            n = x.shape[0]
            pad = (-n) % eval_bs
            xp = jnp.concatenate([x, jnp.zeros((pad,) + x.shape[1:], x.dtype)])
            yp = jnp.concatenate([y, jnp.zeros((pad,), y.dtype)])
            mask = (jnp.arange(n + pad) < n).astype(jnp.float32)

            def batch(args):
                xb, yb, mb = args
                logits = self.eval_fn(params, xb)
                correct = (jnp.argmax(logits, -1) == yb) * mb
                loss = optax.softmax_cross_entropy_with_integer_labels(logits, yb) * mb
                return jnp.sum(correct), jnp.sum(loss)

            shape = lambda a: a.reshape((-1, eval_bs) + a.shape[1:])
            correct, loss = jax.lax.map(batch, (shape(xp), shape(yp), shape(mask)))
            return jnp.sum(correct) / n, jnp.sum(loss) / n

        self._evaluate = jax.jit(evaluate)
        # (params finite, server optimizer state finite): run_round's check of the
        # server step. No donation: the state goes on to the next round.
        # One array, read in one transfer.
        self._server_state_finite = jax.jit(lambda p, o: jnp.stack([_all_finite(p),
                                                                    _all_finite(o)]))

    # --- running -----------------------------------------------------------

    def evaluate(self, params) -> tuple[float, float]:
        """(test accuracy, test loss) of ``params`` on the test split."""
        with self.numerics():
            acc, loss = self._evaluate(params, self._x_test, self._y_test)
        return float(acc), float(loss)

    def run_round(self, state: ServerState, round_idx: int) -> tuple[ServerState, RoundResult]:
        """One round: cohort, local training, defenses, aggregation, server step.

        Before the first round of a vmap, map, chunked or sharded strategy, its cohort
        step for the real cohort is planned against the free memory
        (:func:`fedsim.memory.check_cohort_step`).

        Pruned FL with reconfigurations: at a reconfiguration round the server
        first makes its new mask (:meth:`_reconfigure`).

        Raises:
          NonFiniteError: if a client's loss/update is NaN/Inf and
            ``training.on_nonfinite`` is "stop" (the state is left unchanged);
            whatever it is, if the server step made the global params or the
            server optimizer state NaN/Inf.
          InsufficientMemoryError: the cohort step plans more memory than is free.
        """
        k = self.reconfiguration_at(round_idx)
        if k is not None:
            state = self._reconfigure(state, k)
        checked = self.__dict__.setdefault("_memory_checked", set())
        if self.strategy in memory.COHORT_STEP_STRATEGIES and self.strategy not in checked:
            memory.check_cohort_step(self)  # its compile serves the round below
            checked.add(self.strategy)
        t0 = time.perf_counter()
        ids = self.cohort(round_idx)
        _, ckey = self.round_keys(round_idx)
        observed_ids = (set(self.cfg.observer.clients)
                        if round_idx in self.cfg.observer.rounds else set())
        with self.numerics():
            new_state, losses, weights, finite, observed = self._train_cohort(
                state, ids, ckey, round_idx, observed_ids)
        bad = [int(c) for c, f in zip(ids, finite) if not f]
        ok = weights > 0
        # NaN where no client counted (all skipped): the model did not move
        # (``finish`` kept the params and the server optimizer state), and a
        # loss of 0 would read as a perfect round.
        train_loss = (float(np.sum(losses[ok] * weights[ok]) / np.sum(weights[ok])) if ok.any()
                      else float("nan"))
        jax.block_until_ready(new_state.params)
        seconds = time.perf_counter() - t0
        self._raise_if_server_step_nonfinite(round_idx, new_state)
        return new_state, RoundResult(round_idx, ids, train_loss, seconds, bad, observed)

    def _raise_if_server_step_nonfinite(self, round_idx: int, state: ServerState) -> None:
        """Stop a round whose server step made the global model NaN/Inf.

        The clients' uploads are checked one by one (``_raise_if_nonfinite``),
        but finite uploads times an extreme ``training.server_lr`` (or an
        optimizer state that overflows) can still give NaN/Inf global params:
        runs then ended with exit 0 and ``test_loss: Infinity``, or, under
        ``skip_client``, went on skipping every client of a dead model. Checked
        here, after every strategy's round step, whatever
        ``training.on_nonfinite`` says: skipping clients cannot mend the global
        model. One jitted reduction over the new params and server optimizer
        state, read once the round is done (its time is not in the round's
        ``seconds``).

        Raises:
          NonFiniteError: naming the round, what is non-finite and the settings
            of the server step. The round's input state may have been donated
            to its step by then.
        """
        params_ok, opt_ok = np.asarray(self._server_state_finite(state.params, state.opt_state))
        if params_ok and opt_ok:
            return
        t = self.cfg.training
        what = ("global params" if not params_ok else
                "server optimizer state (its moments overflowed; the params would stop moving)")
        raise NonFiniteError(
            f"round {round_idx}: the server step produced NaN/Inf {what} from the clients' "
            f"finite uploads: lower training.server_lr ({t.server_lr}) or change "
            f"training.server_optimizer ({t.server_optimizer}). training.on_nonfinite does "
            "not apply: it skips clients, not the server step")

    def _train_cohort(self, state: ServerState, ids: np.ndarray, ckey, round_idx: int,
                      observed_ids: set[int] = frozenset()):
        """Train cohort ``ids`` with the current strategy and aggregate.

        Returns (new_state, losses, weights, finite, observed) with the
        per-client arrays as numpy. Raises NonFiniteError before committing.
        """
        observed: list[ObservedUpload] = []
        stop = self.cfg.training.on_nonfinite == "stop"
        gmask = self._mask_arg()
        if self.mesh is not None:
            # The sharded step returns the state replicated over the mesh, while
            # round 0's (from init_state or a checkpoint) sits on one device: a
            # different input sharding, so round 1 compiled the step a second
            # time. Placing the state on the mesh first (a no-op from round 1 on)
            # gives every round the same one executable.
            from fedsim import sharding
            state = sharding.replicate(self.mesh, state)
        if self.strategy != "loop":
            # The observed clients' uploads, computed again on their own before the
            # cohort step (which may donate the state). The cohort then trains on
            # the strategy's own path, so observing a round leaves its numbers as
            # they are unobserved; the observed upload equals the one aggregated
            # up to float rounding between a client alone and under vmap.
            for cid in (int(c) for c in ids if int(c) in observed_ids):
                cs = jax.tree_util.tree_map(lambda s: s[cid], state.client_states)
                out, _ = self._run_client(state.params, gmask, self._x, self._y, self._idx,
                                          jnp.int32(cid), cs, ckey)
                observed.append(self._observation(out, state.params, cid, round_idx))
        if self.strategy == "loop":
            wsum = jax.tree_util.tree_map(jnp.zeros_like, state.params)
            wtot = zero_total(state.params, self.cfg.training.aggregation)
            losses, weights, finite, new_cs = [], [], [], []
            per_call = self.cfg.training.loop_clients_per_call
            pos = 0
            while pos < len(ids):
                group = ids[pos:pos + per_call]
                if len(group) == per_call > 1 and not observed_ids.intersection(
                        int(c) for c in group):
                    wsum, wtot, outs, fins = self._run_and_accumulate_many(
                        state.params, gmask, wsum, wtot, self._x, self._y, self._idx,
                        jnp.asarray(group, jnp.int32), state.client_states, ckey)
                    losses.append(outs.loss)
                    weights.append(outs.num_examples)
                    finite.append(fins)
                    new_cs.append(outs.client_state)
                    pos += per_call
                    continue
                cid = ids[pos]
                pos += 1
                if int(cid) in observed_ids:
                    cs = jax.tree_util.tree_map(lambda s: s[cid], state.client_states)
                    out, fin = self._run_client(state.params, gmask, self._x, self._y,
                                                self._idx, jnp.int32(cid), cs, ckey)
                    observed.append(self._observation(out, state.params, int(cid), round_idx))
                    wsum, wtot = self._accumulate(wsum, wtot, out.update, out.num_examples)
                else:
                    wsum, wtot, out, fin = self._run_and_accumulate(
                        state.params, gmask, wsum, wtot, self._x, self._y, self._idx,
                        jnp.int32(cid), state.client_states, ckey)
                one = lambda a: jnp.expand_dims(a, 0)
                losses.append(one(out.loss))
                weights.append(one(out.num_examples))
                finite.append(one(fin))
                new_cs.append(jax.tree_util.tree_map(one, out.client_state))
            losses, weights, finite = map(lambda v: np.asarray(jnp.concatenate(v)),
                                          (losses, weights, finite))
            stacked = jax.tree_util.tree_map(lambda *a: jnp.concatenate(a), *new_cs)
            self._raise_if_nonfinite(round_idx, ids, finite, stop)
            new_state = self._finish(state, wsum, wtot, jnp.asarray(ids), stacked)
        else:
            # Check finiteness before committing: keep the input state alive.
            if stop and self.donate:
                state = jax.tree_util.tree_map(jnp.copy, state)
            new_state, losses, weights, finite = self._cohort_step(
                state, gmask, self._x, self._y, self._idx, jnp.asarray(ids), ckey)
            losses, weights, finite = np.asarray(losses), np.asarray(weights), np.asarray(finite)
            self._raise_if_nonfinite(round_idx, ids, finite, stop)
        return new_state, losses, weights, finite, observed

    def _raise_if_nonfinite(self, round_idx, ids, finite, stop):
        bad = [int(c) for c, f in zip(ids, finite) if not f]
        if bad and stop:
            # Every client at once points at the model they all started from: a
            # server step can leave finite weights so large that training on them
            # overflows (caught a round late, as the server step's own check
            # sees only NaN/Inf).
            t = self.cfg.training
            every = ""
            if round_idx > 0 and len(bad) == len(ids):
                every = (" (every client of the round: the global model they started from "
                         "may have diverged in the last server step; see training.server_lr)")
            elif round_idx > 0 and (t.server_optimizer != "sgd" or t.server_lr > 1):
                # A server step other than FedAvg's average can move the model past
                # every client's own update (fedadagrad at server_lr 1 broke one
                # client of ten a round later: benchmarks/results/
                # server_optimizers_fmnist.md); the message blamed training.lr alone.
                every = (f" (they started from the last server step's model: "
                         f"training.server_optimizer {t.server_optimizer} at server_lr "
                         f"{t.server_lr} can move it past the clients' updates; lower "
                         f"training.server_lr if it diverged)")
            # A defense's setting (σ = 1e30, a huge clip norm) overflows as a
            # large lr does; the message used to blame training.lr alone.
            specs = getattr(self, "defense_specs", None) or []
            named = ([f"defenses[{i}] {spec.get('name')}" for i, spec in enumerate(specs)]
                     or [f"{d.name} ({stage})" for stage, d in getattr(self, "defenses", {}).items()])
            blame = (f"; lower training.lr or check the defenses' settings ({', '.join(named)})"
                     if named else "; lower training.lr")
            raise NonFiniteError(f"round {round_idx}: client {bad[0]} produced a NaN/Inf "
                                 f"loss or update (clients {bad}){every}{blame}, "
                                 "or set training.on_nonfinite=skip_client")

    def _observation(self, out: ClientOutput, params, cid: int, round_idx: int) -> ObservedUpload:
        t = self.cfg.training
        n = int(self.client_counts[cid])
        sel = np.asarray(self.partitions[cid][:n])
        x, y = self.dataset.x_train[sel], self.dataset.y_train[sel]
        B = n if t.algorithm == "fedsgd" else min(t.batch_size, n)
        steps = (1 if t.algorithm == "fedsgd" else t.local_epochs) * -(-n // B)
        if self.donate:  # the round step is about to take the server state's buffers
            params = jax.tree_util.tree_map(jnp.copy, params)
        obs = Observation(
            update=out.update, params=params, apply_fn=self.apply_fn, algorithm=t.algorithm,
            lr=t.lr, local_steps=steps, batch_size=B, num_examples=n, labels=jnp.asarray(y),
            input_shape=self.dataset.input_shape, num_classes=self.dataset.num_classes,
            client_id=cid, round=round_idx)
        return ObservedUpload(obs, x, y)


def check_float64(cfg: Config) -> None:
    """Refuse ``training.dtype: float64`` while JAX runs 32-bit floats only.

    Without ``jax_enable_x64`` JAX turns every float64 array into float32, so
    the run would be a float32 run recorded as float64.

    Raises:
      ConfigError: naming the key and how to turn 64-bit JAX on.
    """
    if cfg.training.dtype == "float64" and not jax.config.jax_enable_x64:
        raise ConfigError("config key 'training.dtype' (float64): JAX computes in float64 only "
                          "with jax_enable_x64 on; set JAX_ENABLE_X64=1 or call "
                          "jax.config.update('jax_enable_x64', True) before building the "
                          "simulation (fedsim run turns it on itself)")


def enable_config_dtype(cfg: Config) -> None:
    """Turn on ``jax_enable_x64`` for a ``training.dtype: float64`` config.

    ``fedsim run`` calls it for the process it owns; the library leaves JAX's
    settings to its caller (:func:`check_float64` names what is missing).
    """
    if cfg.training.dtype == "float64" and not jax.config.jax_enable_x64:
        jax.config.update("jax_enable_x64", True)


def _copy(tree):
    """New buffers for ``tree`` (a state's leaves may be donated to the round step)."""
    return jax.tree_util.tree_map(jnp.copy, tree)


def _end_round(defenses: dict[str, Defense], states: dict, ids, cohort_states: dict,
               counted) -> dict:
    """Every client's defense state after the server steps of the defenses that have one
    (``Defense.end_round``); the stages without one are returned as they are.

    ``counted`` (bool scalar) is False where every client of the round was
    skipped: then, as for the model, there is no server step, and the states
    stay as they were.
    """
    out = dict(states)
    for stage, d in defenses.items():
        if d.end_round is not None:
            stepped = d.end_round(states[stage], ids, cohort_states[stage])
            out[stage] = jax.tree_util.tree_map(lambda n, o: jnp.where(counted, n, o),
                                                stepped, states[stage])
    return out


def _apply_mask(params, mask):
    """w ⊙ m, leaf by leaf, in each weight's dtype."""
    return jax.tree_util.tree_map(lambda w, m: w * m.astype(w.dtype), params, mask)


def _check_global_mask(mask, params) -> None:
    """Raise ValueError, naming the leaf, unless ``mask`` is a {0, 1} pytree like ``params``."""
    want, got = jax.tree_util.tree_structure(params), jax.tree_util.tree_structure(mask)
    if want != got:
        raise ValueError(f"global mask: its tree structure differs from the params' "
                         f"(got {got}, want {want})")
    # Equal structures: the params' leaves come in the mask's order.
    for (path, m), w in zip(jax.tree_util.tree_flatten_with_path(mask)[0],
                            jax.tree_util.tree_leaves(params)):
        name = jax.tree_util.keystr(path)
        if np.shape(m) != np.shape(w):
            raise ValueError(f"global mask{name}: shape {np.shape(m)}, the params' is "
                             f"{np.shape(w)}")
        values = np.asarray(m)
        if not np.isin(values, (0, 1)).all():  # NaN is neither
            bad = values[~np.isin(values, (0, 1))].ravel()[0]
            raise ValueError(f"global mask{name}: values must be 0 or 1, found {float(bad)}")


def _check_model_fits(model, name: str, input_shape) -> None:
    """Trace the model's init (no compute) so a too-small input is a ConfigError."""
    try:
        jax.eval_shape(lambda k: init_params(model, input_shape, k), jax.random.key(0))
    except Exception as e:
        raise ConfigError(f"config key 'model.name': {name!r} cannot take inputs of shape "
                          f"{tuple(input_shape)} (see data.image_size): {type(e).__name__}: "
                          f"{str(e).splitlines()[0][:200]}") from None


def _gather(x_all, y_all, idx_all, cid) -> CohortData:
    idx = idx_all[cid]
    valid = idx >= 0
    safe = jnp.where(valid, idx, 0)
    mask = valid.astype(jnp.float32)
    x = x_all[safe] * mask.reshape((-1,) + (1,) * (x_all.ndim - 1))
    y = jnp.where(valid, y_all[safe], 0)
    return CohortData(x, y, mask, jnp.sum(valid).astype(jnp.int32))


def _all_finite(tree) -> jax.Array:
    """Whether every leaf of ``tree`` is finite (True for a tree without leaves,
    such as plain SGD's optimizer state)."""
    leaves = jax.tree_util.tree_leaves(tree)
    if not leaves:
        return jnp.array(True)
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(l)) for l in leaves]))
