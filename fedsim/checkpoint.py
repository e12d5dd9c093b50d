"""Checkpoint/resume of a simulation with orbax.

What is saved after round r (``output.checkpoint_every``):

* the full :class:`~fedsim.typing.ServerState`: global params, server
  optimizer state, the round counter, and the per-client defense states
  (``client_states``: PriPrune / Pseudo-Pruning masks, momentum, ...), saved
  as its flat list of leaves and restored into the structure the current
  config builds (a checkpoint written by a different model or defense set is
  rejected with a clear error);
* JSON metadata: the config fingerprint, the strategy the run used (a resumed
  ``auto`` run keeps the same strategy, so its numbers match bit for bit), and
  the state of every round callback that has ``state_dict()`` /
  ``load_state_dict(d)`` methods (the hook for privacy accountants and other
  host-side per-round state).

Not saved because it is a pure function of (seed, round): PRNG keys (round r
uses ``fold_in(fold_in(key(seed), 1), r)``) and the cohort sampler (its key
is derived from the round key), so they are recomputed exactly on resume.

Orbax writes each step into a temporary directory and renames it when
complete, so a run killed mid-save (SIGKILL) leaves the previous checkpoint
intact and the partial one is ignored.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import jax
import numpy as np

from fedsim.config import SERVER_HYPERPARAMETER_KEYS, UNROLL_STEPS
from fedsim.hooks import spec_of
from fedsim.server import SERVER_HYPERPARAMETERS
from fedsim.typing import ServerState


class CheckpointError(RuntimeError):
    """A checkpoint is unreadable or belongs to another config; names the path."""


def config_fingerprint(cfg) -> str:
    """Hash of everything in the config that changes the numbers of a run.

    Left out: ``output.*`` (where and how often to write), ``training.rounds``
    (a finished run may be extended), ``name`` (a label; sweep cells that
    differ only in what follows can share a simulation) and ``attack`` (what
    ``fedsim attack`` does with the observed uploads, so a finished run can be
    attacked again with other settings).

    A defense's integral numbers are hashed alike however they were written
    (``clip_norm: 1`` and ``clip_norm: 1.0`` build the same defense, and YAML
    keeps the one as an int and the other as a float): see
    :func:`_integral_floats_as_ints`. The typed sections need no such care,
    since loading converts their values to the field's type.
    """
    d = _without_unhashed(_as_hashed_before(cfg))
    if "defenses" in d:
        d["defenses"] = _integral_floats_as_ints(d["defenses"])
    return _hash(d)


def _without_unhashed(d: dict) -> dict:
    for key in ("output", "name", "attack"):
        d.pop(key, None)
    d.get("training", {}).pop("rounds", None)
    return d


def _integral_floats_as_ints(value):
    """``value`` with every float that is a whole number written as that int,
    in nested dicts and lists; booleans, other numbers and strings as they are.

    An int of a defense parameter that must be a float is used as that float
    (Python's arithmetic does), and an int parameter refuses a float, so two
    specs that differ only this way build the same defense or one fails.
    """
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _integral_floats_as_ints(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_integral_floats_as_ints(v) for v in value]
    return value


def _as_hashed_before(cfg) -> dict:
    """``cfg`` as a dict without the keys that came later and change nothing of
    what was hashed before: a dense ``pruning`` section
    (:func:`_without_dense_pruning`) and ``observer.fill`` where it is the rule
    earlier runs followed.

    ``observer.fill`` (2026-11-27) only matters where rounds and clients are
    observed. Runs before it completed an observed cohort by cutting the sorted
    draw, which is ``sorted_cut``, not the new default ``uniform``: so the fill
    is left out of the hash where nothing is observed or it is ``sorted_cut``
    (an earlier checkpoint resumes under the rule it was written with), and
    ``uniform`` with an observer is hashed (such a checkpoint from the day the
    default was hashed away is refused by name, not resumed under another rule).
    ``training.unroll_steps`` (2026-11-28) is hashed only where it is not 32,
    the unrolling every earlier run used; ``training.dtype`` (2026-11-30) only
    where it is not float32; the server optimizer's ``training.server_momentum``,
    ``server_b1``, ``server_b2`` and ``server_tau`` (2026-12-02) only where set
    to other than the chosen optimizer's default (null or that value builds the
    optimizer every earlier run used). The ``accounting`` section
    (2026-11-29) is hashed only where it sets a δ: a run's ε rows must keep
    one δ across a resume.
    """
    d = _without_dense_pruning(cfg.to_dict())
    obs = d.get("observer", {})
    if "fill" in obs and (not (obs.get("clients") and obs.get("rounds"))
                          or obs["fill"] == "sorted_cut"):
        obs.pop("fill")
    training = d.get("training", {})
    if training.get("unroll_steps") == UNROLL_STEPS:  # the rule before the key (2026-11-28)
        training.pop("unroll_steps")
    if training.get("dtype") == "float32":  # the only type before the key (2026-11-30)
        training.pop("dtype")
    defaults = SERVER_HYPERPARAMETERS.get(training.get("server_optimizer"), {})
    for name, key in SERVER_HYPERPARAMETER_KEYS.items():
        # null or the optimizer's own default: what every run before the keys
        # used (2026-12-02), and the same optimizer either way.
        if key in training and training[key] in (None, defaults.get(name)):
            training.pop(key)
    if not any(v is not None for v in (d.get("accounting") or {}).values()):
        d.pop("accounting", None)  # the accountants' defaults, the rule before the section
    return d


def _without_dense_pruning(d: dict) -> dict:
    """``d`` without a ``pruning`` section that prunes nothing: configs gained
    that section on 2026-11-27, and checkpoints written before (which never
    pruned) must keep their fingerprints. A fixed mask's section is hashed
    without ``reconfigurations`` and ``reconfigure_every``, which came a day
    later and do nothing then."""
    pruning = d.get("pruning") or {}
    if pruning.get("scheme") is None:
        d.pop("pruning", None)
    elif pruning.get("reconfigurations", 1) == 1:
        d["pruning"] = {k: v for k, v in pruning.items()
                        if k not in ("reconfigurations", "reconfigure_every")}
    return d


def legacy_fingerprint(cfg) -> str:
    """The fingerprint checkpoints were written with until 2026-11-26.

    It left out only ``output`` and ``training.rounds``. Checkpoints carrying
    it still resume (:func:`accepted_fingerprints`); new saves write
    :func:`config_fingerprint`.
    """
    d = _as_hashed_before(cfg)
    d.pop("output", None)
    d.get("training", {}).pop("rounds", None)
    return _hash(d)


def written_as_given_fingerprint(cfg) -> str:
    """The fingerprint checkpoints and observation files were written with
    from 2026-11-26 until 2026-11-29: :func:`config_fingerprint` without
    :func:`_integral_floats_as_ints`, so a defense's ``1`` and ``1.0`` hashed
    apart."""
    return _hash(_without_unhashed(_as_hashed_before(cfg)))


def accepted_fingerprints(cfg) -> tuple[str, ...]:
    """The fingerprints a checkpoint or an observation file of ``cfg`` may
    carry: the current one first, then those earlier code wrote
    (:func:`written_as_given_fingerprint`, :func:`legacy_fingerprint`)."""
    return tuple(dict.fromkeys((config_fingerprint(cfg), written_as_given_fingerprint(cfg),
                                legacy_fingerprint(cfg))))


def _hash(d: dict) -> str:
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


class Checkpointer:
    """Saves and restores the server state of one run directory.

    Args:
      directory: where checkpoints live (``RUN_DIR/checkpoints``).
      max_to_keep: how many recent checkpoints to keep.
    """

    def __init__(self, directory, max_to_keep: int = 2):
        import orbax.checkpoint as ocp

        self._ocp = ocp
        self.directory = Path(directory).absolute()
        try:
            self.manager = ocp.CheckpointManager(
                self.directory,
                options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep,
                                                     enable_async_checkpointing=False,
                                                     create=True))
        except Exception as e:
            raise CheckpointError(f"cannot open checkpoint directory {self.directory}: "
                                  f"{type(e).__name__}: {e}") from None

    def latest_round(self) -> int | None:
        """Rounds completed by the newest complete checkpoint, or None."""
        return self.manager.latest_step()

    def save(self, rounds_done: int, state: ServerState, meta: dict) -> None:
        """Save the state after ``rounds_done`` rounds (blocking, atomic)."""
        ocp = self._ocp
        leaves = {f"{i:05d}": np.asarray(l) for i, l in enumerate(jax.tree_util.tree_leaves(state))}
        self.manager.save(rounds_done, args=ocp.args.Composite(
            state=ocp.args.StandardSave(leaves), meta=ocp.args.JsonSave(meta)), force=True)
        self.manager.wait_until_finished()

    def restore(self, template: ServerState, fingerprint: str | tuple[str, ...] | None = None,
                rounds_done: int | None = None) -> tuple[ServerState, dict]:
        """Restore the newest (or given) checkpoint into ``template``'s structure.

        ``fingerprint`` is the config's fingerprint, or the fingerprints it
        accepts (:func:`accepted_fingerprints`), the current one first.

        Raises:
          CheckpointError: unreadable/corrupted files, or a checkpoint written by
            a different config (fingerprint or state structure differs).
        """
        ocp = self._ocp
        step = self.latest_round() if rounds_done is None else rounds_done
        if step is None:
            raise CheckpointError(f"no complete checkpoint in {self.directory}")
        where = self.directory / str(step)
        try:
            meta = self.manager.restore(step, args=ocp.args.Composite(
                meta=ocp.args.JsonRestore()))["meta"]
        except Exception as e:
            raise CheckpointError(f"checkpoint {where} is unreadable or corrupted "
                                  f"({type(e).__name__}: {str(e)[:200]}); delete it to start over"
                                  ) from None
        problem = _meta_problem(meta)
        if problem:
            raise CheckpointError(f"checkpoint {where} is corrupted: its metadata {problem}; "
                                  "delete it to start over")
        accepted = (fingerprint,) if isinstance(fingerprint, str) else fingerprint
        if accepted is not None and meta.get("config_fingerprint") not in accepted:
            raise CheckpointError(
                f"checkpoint {where} was written by a different config (fingerprint "
                f"{meta.get('config_fingerprint')} != {accepted[0]}); use another output.dir "
                "or delete the checkpoints to start over")
        flat, treedef = jax.tree_util.tree_flatten(template)
        if meta.get("num_leaves") not in (None, len(flat)):
            raise CheckpointError(f"checkpoint {where} holds {meta.get('num_leaves')} state arrays, "
                                  f"the current config builds {len(flat)}: different model/defenses")
        abstract = {f"{i:05d}": jax.ShapeDtypeStruct(np.shape(l), np.asarray(l).dtype)
                    for i, l in enumerate(flat)}
        try:
            leaves = self.manager.restore(step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract)))["state"]
        except Exception as e:
            raise CheckpointError(f"checkpoint {where} is unreadable, corrupted or does not match "
                                  f"the current model ({type(e).__name__}: {str(e)[:200]}); "
                                  "delete it to start over") from None
        restored = []
        for i, ref in enumerate(flat):
            arr = leaves[f"{i:05d}"]
            if np.shape(arr) != np.shape(ref):
                raise CheckpointError(f"checkpoint {where}: state array {i} has shape "
                                      f"{np.shape(arr)}, expected {np.shape(ref)}")
            restored.append(jax.numpy.asarray(arr, dtype=np.asarray(ref).dtype))
        return jax.tree_util.tree_unflatten(treedef, restored), meta

    def close(self) -> None:
        self.manager.close()


def callback_states(callbacks) -> list:
    """``state_dict()`` of each round callback that has one (else None)."""
    return [cb.state_dict() if hasattr(cb, "state_dict") else None for cb in callbacks]


def load_callback_states(callbacks, states) -> None:
    """Hand saved callback states back through ``load_state_dict``."""
    for cb, st in zip(callbacks, states or []):
        if st is not None and hasattr(cb, "load_state_dict"):
            cb.load_state_dict(st)


def read_meta(directory) -> dict | None:
    """Metadata of the newest complete checkpoint in ``directory`` (None if none).

    In several processes, process 0's view of whether ``directory`` exists
    decides for all (:func:`fedsim.distributed.agree`): opening it is a
    collective (orbax syncs the processes), and a process that looked after
    process 0 had created it would open it alone and wait in a collective the
    others never join.
    """
    from fedsim import distributed

    if not distributed.agree(Path(directory).is_dir()):
        return None
    ck = Checkpointer(directory)
    step = ck.latest_round()
    if step is None:
        return None
    ocp = ck._ocp
    try:
        meta = ck.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    except Exception as e:
        raise CheckpointError(f"checkpoint {ck.directory / str(step)} is unreadable or corrupted "
                              f"({type(e).__name__}); delete it to start over") from None
    finally:
        ck.close()
    problem = _meta_problem(meta)
    if problem:
        raise CheckpointError(f"checkpoint {ck.directory / str(step)} is corrupted: its metadata "
                              f"{problem}; delete it to start over")
    return meta


def _meta_problem(meta) -> str | None:
    """What is wrong with a checkpoint's metadata, or None.

    Read as it was, a list raised an AttributeError, ``"callbacks": 5`` a
    TypeError, and ``"strategy": "warp"`` resumed a run whose log and summary
    then named a strategy that does not exist.
    """
    from fedsim.calibrate import CANDIDATES, SHARDED

    if not isinstance(meta, dict):
        return f"is a {type(meta).__name__}, not a JSON object"
    strategy = meta.get("strategy")
    if strategy is not None and strategy not in (*CANDIDATES, SHARDED):
        return f"names the strategy {strategy!r}, which is none of {', '.join((*CANDIDATES, SHARDED))}"
    callbacks = meta.get("callbacks")
    if callbacks is not None and not isinstance(callbacks, list):
        return f"has callbacks {callbacks!r}, not a list"
    for key in ("hand_defenses", "hand_defense_specs"):
        if meta.get(key) is not None and not isinstance(meta[key], dict):
            return f"has {key} {meta[key]!r}, not a mapping"
    return None


def make_meta(cfg, sim, state) -> dict:
    """The JSON metadata saved beside the state."""
    return {"config_fingerprint": config_fingerprint(cfg), "strategy": sim.strategy,
            "num_leaves": len(jax.tree_util.tree_leaves(state)), "seed": cfg.seed,
            "callbacks": callback_states(sim.round_callbacks),
            "hand_defenses": hand_defense_names(sim),
            "hand_defense_specs": hand_defense_specs(sim)}


def hand_defense_names(sim) -> dict[str, str]:
    """Stage -> name of the defenses ``sim`` was given by hand ({} for a config's).

    The names are for people (``dp_gaussian(sigma=1,C=1,flat)``); what tells
    hand-given defenses apart in a checkpoint is :func:`hand_defense_specs`.
    """
    return {stage: d.name for stage, d in _hand_defenses(sim)}


def hand_defense_specs(sim) -> dict[str, str]:
    """Stage -> spec of the defenses ``sim`` was given by hand ({} for a config's).

    The config fingerprint covers a config's defenses; defenses passed as
    ``Simulation(defenses=...)`` are in no config, so their specs
    (:attr:`fedsim.hooks.Defense.spec`: the registered factory and every
    argument, arrays by digest; the name for a Defense built by hand) stand for
    them in the checkpoint.
    """
    return {stage: spec_of(d) for stage, d in _hand_defenses(sim)}


def _hand_defenses(sim):
    if not getattr(sim, "defenses_by_hand", False):
        return []
    own = getattr(sim, "_own_defenses", sim.defenses)  # before a pruning mask goes around
    return sorted(own.items())


def check_hand_defenses(meta: dict, sim, where) -> None:
    """Refuse to resume a checkpoint under other hand-given defenses than it was
    written with: their specs differ (:func:`hand_defense_specs`), or, in a
    checkpoint written before specs were recorded, their names.

    Checkpoints from before either was recorded carry neither and are resumed
    as before.

    Raises:
      CheckpointError: naming the stages whose defenses differ, with both
        versions, and the checkpoint.
    """
    if "hand_defense_specs" in meta:
        saved, now = meta["hand_defense_specs"], hand_defense_specs(sim)
    elif "hand_defenses" in meta:
        saved, now = meta["hand_defenses"], hand_defense_names(sim)
    else:
        return
    if saved != now:
        differ = sorted(s for s in set(saved) | set(now) if saved.get(s) != now.get(s))
        shown = "; ".join(f"{s}: {saved.get(s, 'none')} then, {now.get(s, 'none')} now"
                          for s in differ)
        raise CheckpointError(
            f"checkpoint {where} was written with other defenses given by hand than this "
            f"simulation has ({shown}); the config fingerprint cannot tell them apart. Use "
            "another output.dir or delete the checkpoints to start over")
