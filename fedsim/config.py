"""Experiment configs: YAML files mapped onto frozen, validated dataclasses.

Unknown keys, wrong types and out-of-range values raise :class:`ConfigError`
whose message names the key (``training.rounds``) and what is allowed.
``--set key=value`` overrides accept a dotted path or a bare leaf name
(``rounds`` = ``training.rounds``; a bare name found in several sections
means the first of training, data, model, eval, output, observer); values
are parsed as YAML.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
import types
import typing
from dataclasses import field
from pathlib import Path
from typing import Any

import yaml

from fedsim.suggest import close_matches, did_you_mean


class ConfigError(ValueError):
    """An invalid config; the message names the key and the allowed values."""


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, reading ``1e-5`` as a number.

    PyYAML follows YAML 1.1, whose floats need a dot: ``lr: 1e-5`` and
    ``--set training.lr=1e-5`` came back as the *string* ``'1e-5'`` and failed
    validation. YAML 1.2 (and Python's ``float``) read them as floats.
    """


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"))


def _mapping_without_repeats(loader, node, deep=False):
    """A YAML mapping whose repeated key is an error: PyYAML keeps the last one
    silently, so ``training: {...}`` given twice lost the first section."""
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} is given twice in one mapping", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_repeats)


def yaml_load(text: str):
    """``yaml.safe_load``, but ``1e-5`` is a float (:class:`_Loader`)."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader subclass)


def _f(default, **meta):
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


PARALLELISM = ("auto", "vmap", "map", "chunked", "loop", "sharded")
#: ``training.unroll_steps``' default, the rule of every run before it was a key
#: (:class:`fedsim.client.LocalTraining`).
UNROLL_STEPS = 32
OBSERVER_FILLS = ("uniform", "sorted_cut")


@dataclasses.dataclass(frozen=True)
class DataConfig:
    dataset: str = _f("fashion_mnist", doc="dataset name (tfds name, 'fashion_mnist' offline, 'synthetic')")
    source: str = _f("auto", choices=("auto", "idx", "tfds"))
    data_dir: str | None = _f(None)
    image_size: int | None = _f(None, min=4, max=512)
    num_clients: int = _f(100, min=1)
    partition: str = _f("iid", choices=("iid", "dirichlet", "shards", "natural"))
    alpha: float = _f(0.5, gt=0.0)
    classes_per_client: int = _f(2, min=1)
    examples_per_client: int | None = _f(None, min=1)
    max_train: int | None = _f(None, min=1)
    max_test: int | None = _f(None, min=1)
    label_key: str | None = _f(None)
    normalize: bool = _f(False)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    name: str = _f("lenet5")


@dataclasses.dataclass(frozen=True)
class TrainingConfig:
    algorithm: str = _f("fedavg", choices=("fedavg", "fedsgd"))
    rounds: int = _f(10, min=1)
    clients_per_round: int = _f(10, min=1)
    local_epochs: int = _f(1, min=1)
    batch_size: int = _f(32, min=1)
    lr: float = _f(0.05, gt=0.0)
    optimizer: str = _f("sgd", choices=("sgd", "momentum", "adam", "adamw"))
    momentum: float = _f(0.9, min=0.0, lt=1.0)
    weight_decay: float = _f(0.0, min=0.0)
    server_optimizer: str = _f("sgd", choices=("sgd", "momentum", "adam", "yogi", "adagrad",
                                               "fedadam", "fedyogi", "fedadagrad"),
                               doc="optimizer on the pseudo-gradient -mean(update): adam, yogi, "
                                   "adagrad as optax defines them (bias-corrected); fedadam, "
                                   "fedyogi, fedadagrad as Reddi et al. 2021 Alg 2 prints them "
                                   "(fedsim.server)")
    server_lr: float = _f(1.0, gt=0.0)
    # The server optimizer's hyperparameters; null takes its default
    # (fedsim.server.SERVER_HYPERPARAMETERS), and one the chosen optimizer does
    # not take is refused by name.
    server_momentum: float | None = _f(None, min=0.0, lt=1.0,
                                       doc="FedAvgM's heavy-ball beta (momentum; default 0.9)")
    server_b1: float | None = _f(None, min=0.0, lt=1.0,
                                 doc="first-moment decay beta1 (adam, yogi, fed*; default 0.9, "
                                     "fedadagrad 0)")
    server_b2: float | None = _f(None, min=0.0, lt=1.0,
                                 doc="second-moment decay beta2 (adam, yogi, fedadam, fedyogi; "
                                     "default 0.999, adam 0.99)")
    server_tau: float | None = _f(None, gt=0.0,
                                  doc="adaptivity tau, optax's eps (adam, yogi, adagrad, fed*; "
                                      "default 1e-3)")
    weighting: str = _f("examples", choices=("examples", "uniform"))
    aggregation: str = _f("mean", choices=("mean", "sender_mean"),
                          doc="server average per coordinate: over the whole cohort (FedAvg) or "
                              "over the clients whose update is non-zero there (sparse/pruned FL)")
    client_parallelism: str = _f("auto", choices=PARALLELISM)
    chunk_size: int = _f(8, min=1)
    loop_clients_per_call: int = _f(4, min=1)
    on_nonfinite: str = _f("stop", choices=("stop", "skip_client"))
    unroll_steps: int = _f(UNROLL_STEPS, min=0,
                           doc="a client's local steps, up to this many, are unrolled into "
                               "straight-line code; more run in a lax.scan (0: always a scan). "
                               "Unrolled steps run faster and compile slower; XLA may round the "
                               "two differently, so it is part of the checkpoint fingerprint. "
                               "A defense whose step unrolls badly (dp_vmf) keeps the scan")
    # XLA's precision for float32 matrix products and convolutions, in training
    # and evaluation. "highest": float32 as written. "default" lets a GPU use
    # TF32 (an H200 multiplied float32 matrices with a relative error of
    # 2.8e-4 at "default", 4.6e-7 at "highest"; CPUs compute float32 either way).
    matmul_precision: str = _f("highest", choices=("highest", "high", "default"))
    dtype: str = _f("float32", choices=("float32", "float64"),
                    doc="floating type of the model, its updates and the inputs. float64 "
                        "needs jax_enable_x64, which fedsim run turns on itself (elsewhere: "
                        "JAX_ENABLE_X64=1); it checks float32 numbers against rounding")


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    every: int = _f(5, min=1)
    batch_size: int = _f(1000, min=1)


@dataclasses.dataclass(frozen=True)
class ObserverConfig:
    clients: list[int] = _f([])
    rounds: list[int] = _f([])
    fill: str = _f("uniform", choices=OBSERVER_FILLS,
                   doc="how an observed round's cohort is completed around the observed "
                       "clients: uniform (a uniform sample of the others); sorted_cut (the "
                       "round's sorted draw cut after the observed clients, biased to low ids: "
                       "what runs recorded before 2026-11-27 did, for replaying them)")


@dataclasses.dataclass(frozen=True)
class PruningConfig:
    """Pruned FL (paper 002, Chu et al. 2023, Alg 1): a global mask from round 0,
    re-made during training by the iterative schemes (PruneFL, FedDST)."""

    scheme: str | None = _f(None, doc="base pruning scheme of the global mask (random, snip, "
                                      "grasp, synflow, prunefl, feddst); none: a dense model")
    p: float = _f(0.5, min=0.0, lt=1.0, doc="share of the prunable weights (kernels) pruned")
    examples: int = _f(64, min=1, doc="training examples SNIP and GraSP score the initial "
                                      "model on")
    synflow_iterations: int = _f(100, min=1)
    reconfigurations: int = _f(1, min=1, doc="masks made in a run, at rounds 0, E, 2E, ... "
                                             "(E = reconfigure_every); more than 1 only for "
                                             "an iterative scheme (prunefl, feddst)")
    reconfigure_every: int = _f(10, min=1, doc="rounds between two reconfigurations")


@dataclasses.dataclass(frozen=True)
class AccountingConfig:
    """δ of the privacy accountants a run attaches (``defenses.dp``); null keeps each default.

    They change no training number, only the ε the metrics report, so a run
    resumes only under the δ it was started with (hashed where set).
    """
    delta: float | None = _f(None, gt=0.0, lt=1.0,
                             doc="δ of the record-level ε of an example-stage DP defense "
                                 "(default 1 / largest client size)")
    client_delta: float | None = _f(None, gt=0.0, lt=1.0,
                                    doc="δ of the user-level ε of client_level_dp "
                                        "(default 1 / number of clients)")
    local_delta: float | None = _f(None, gt=0.0, lt=1.0,
                                   doc="δ of the local-DP ε of clipped Gaussian update noise "
                                       "(default 1 / number of clients)")


@dataclasses.dataclass(frozen=True)
class OutputConfig:
    dir: str | None = _f(None)
    checkpoint_every: int = _f(0, min=0)
    progress: bool = _f(True)
    plots: bool = _f(True)


@dataclasses.dataclass(frozen=True)
class Config:
    name: str = _f("experiment")
    # JAX keys keep the low 32 bits (x64 off): seed + 2**32 would repeat seed's
    # init and cohorts while numpy's partitions differ, and 2**63 crashed.
    seed: int = _f(0, min=0, max=2**32 - 1)
    data: DataConfig = _f(None)
    model: ModelConfig = _f(None)
    training: TrainingConfig = _f(None)
    eval: EvalConfig = _f(None)
    defenses: list[dict] = _f([])
    pruning: PruningConfig = _f(None)
    observer: ObserverConfig = _f(None)
    accounting: AccountingConfig = _f(None)
    output: OutputConfig = _f(None)
    attack: dict | None = _f(None)

    def __post_init__(self):
        for f in dataclasses.fields(self):
            if getattr(self, f.name) is None and _is_dataclass_type(_hints(Config)[f.name]):
                object.__setattr__(self, f.name, _hints(Config)[f.name]())

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# --- generic validation ------------------------------------------------------

def _is_dataclass_type(t) -> bool:
    return isinstance(t, type) and dataclasses.is_dataclass(t)


_HINT_CACHE: dict = {}


def _hints(cls):
    if cls not in _HINT_CACHE:
        _HINT_CACHE[cls] = typing.get_type_hints(cls)
    return _HINT_CACHE[cls]


def _type_name(t) -> str:
    origin = typing.get_origin(t)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(t))
    if t is type(None):
        return "null"
    if origin is not None:
        return f"{origin.__name__}[{', '.join(_type_name(a) for a in typing.get_args(t))}]"
    return {int: "an integer", float: "a number", str: "a string", bool: "true/false",
            dict: "a mapping", list: "a list"}.get(t, getattr(t, "__name__", str(t)))


def _coerce(value, t, path):
    origin = typing.get_origin(t)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(t)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, path)
            except ConfigError as e:
                errors.append(e)
        raise errors[0]
    if _is_dataclass_type(t):
        if not isinstance(value, dict):
            raise ConfigError(f"config key '{path}': expected a mapping, got {value!r}")
        return from_dict(t, value, path)
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"config key '{path}': expected a list, got {value!r}")
        (item_t,) = typing.get_args(t) or (Any,)
        return [_coerce(v, item_t, f"{path}[{i}]") for i, v in enumerate(value)]
    if t is Any:
        return value
    if t is bool:
        if isinstance(value, bool):
            return value
    elif t is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif t is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif t is str:
        if isinstance(value, str):
            return value
    elif t is dict:
        if isinstance(value, dict):
            return value
    raise ConfigError(f"config key '{path}': expected {_type_name(t)}, got {value!r}")


#: The largest count a config key takes where it names no bound of its own.
INT32_MAX = 2**31 - 1


def _check_range(value, meta, path):
    if value is None:
        return
    if "choices" in meta and value not in meta["choices"]:
        raise ConfigError(f"config key '{path}': {value!r} is not allowed; "
                          f"allowed values: {', '.join(map(str, meta['choices']))}"
                          f"{did_you_mean(value, meta['choices'])}")
    bounded = any(k in meta for k in ("min", "max", "gt", "lt"))
    if bounded and isinstance(value, float) and not math.isfinite(value):
        # NaN fails every comparison below, but inf passes min/gt: lr = .inf
        # loaded and only failed in round 0, naming a client.
        raise ConfigError(f"config key '{path}': {value!r} is not a finite number")
    if (isinstance(value, int) and not isinstance(value, bool) and "max" not in meta
            and abs(value) > INT32_MAX):
        # Counts reach jitted code as int32: local_epochs = 3e9 passed here and
        # failed in round 0 with an OverflowError naming no key.
        raise ConfigError(f"config key '{path}': {value!r} is out of range; must be <= "
                          f"{INT32_MAX} (a 32-bit integer)")
    for key, ok, word in (("min", lambda v, b: v >= b, ">="), ("max", lambda v, b: v <= b, "<="),
                          ("gt", lambda v, b: v > b, ">"), ("lt", lambda v, b: v < b, "<")):
        if key in meta and not ok(value, meta[key]):
            raise ConfigError(f"config key '{path}': {value!r} is out of range; must be "
                              f"{word} {meta[key]}")


def from_dict(cls, data: dict, path: str = ""):
    """Build and validate dataclass ``cls`` from a plain dict."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"config section '{path or '<root>'}': expected a mapping, got {data!r}")
    names = {f.name: f for f in dataclasses.fields(cls)}
    for k in data:
        if k not in names:
            where = f"'{path}.{k}'" if path else f"'{k}'"
            raise ConfigError(f"unknown config key {where}; allowed keys"
                              f"{' in ' + repr(path) if path else ''}: {', '.join(names)}"
                              f"{did_you_mean(k, names)}")
    kwargs = {}
    hints = _hints(cls)
    for name, f in names.items():
        key_path = f"{path}.{name}" if path else name
        if name in data:
            value = _coerce(data[name], hints[name], key_path)
            _check_range(value, f.metadata, key_path)
            kwargs[name] = value
        elif _is_dataclass_type(hints[name]):
            kwargs[name] = hints[name]()
    return cls(**kwargs)


def _leaf_paths(cls, prefix="") -> list[str]:
    out = []
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        t = hints[f.name]
        p = f"{prefix}{f.name}"
        if _is_dataclass_type(t):
            out.extend(_leaf_paths(t, p + "."))
        else:
            out.append(p)
    return out


_BARE_PRIORITY = ("training", "data", "model", "eval", "output", "observer")


def _key_hint(key: str, leaves: list[str]) -> str:
    """The "did you mean" for an unknown ``--set`` key: a close dotted key, or for a
    bare name a close leaf name, given as the dotted key ``--set`` would set."""
    loose = _DEFENSE_KEY_LOOSE.match(key)
    if loose:
        return f"; did you mean 'defenses[{loose.group(1)}].{loose.group(2)}'?"
    hint = did_you_mean(key, leaves)
    if hint or "." in key:
        return hint
    found = close_matches(key, {p.split(".")[-1] for p in leaves})
    if not found:
        return ""
    ranked = sorted((p for p in leaves if p.split(".")[-1] == found[0]),
                    key=lambda p: _BARE_PRIORITY.index(p.split(".")[0])
                    if p.split(".")[0] in _BARE_PRIORITY else len(_BARE_PRIORITY))
    return f"; did you mean {ranked[0]!r}?"


#: ``defenses[i].PARAM``: parameter PARAM of the config's i-th defense, a key of
#: ``--set`` and of ``fedsim sweep --grid``.
DEFENSE_KEY = re.compile(r"^defenses\[(\d+)\]\.(\w+)$")

# What a user may type for a defense's parameter instead: defenses.0.PARAM,
# defenses[0]PARAM, defenses0.PARAM (the hint names the form that works).
_DEFENSE_KEY_LOOSE = re.compile(r"^defenses\W*(\d+)\W*(\w+)$")


def set_defense_param(raw: dict, key: str, value, flag: str = "--set") -> None:
    """``raw["defenses"][i][PARAM] = value`` for ``key = "defenses[i].PARAM"``.

    The parameter is set as given; the defense's own checks (a known
    parameter, its range) run where the config is validated and the defense
    is built, as for a parameter written in the file.

    Raises:
      ConfigError: when the config has no ``defenses[i]`` mapping, naming the
        key and the defenses it has.
    """
    m = DEFENSE_KEY.match(key)
    if m is None:
        raise ValueError(f"{key!r} is not a defenses[i].PARAM key")
    i, param = int(m.group(1)), m.group(2)
    defs = raw.get("defenses")
    if not isinstance(defs, list) or i >= len(defs) or not isinstance(defs[i], dict):
        names = [d.get("name") if isinstance(d, dict) else d for d in defs] \
            if isinstance(defs, list) else []
        has = (f"it has {len(names)}: " + ", ".join(f"defenses[{j}] = {n!r}"
                                                     for j, n in enumerate(names))
               if names else "it has none")
        raise ConfigError(f"{flag} {key}: the config has no defenses[{i}] ({has})")
    defs[i][param] = value


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """Apply ``key=value`` overrides (values parsed as YAML) to a raw config dict.

    A key is a dotted config key (``training.lr``), a bare name that one
    resolves to (``lr``), ``attack.…``, or ``defenses[i].PARAM`` for a
    parameter of the config's i-th defense (:data:`DEFENSE_KEY`).

    Raises:
      ConfigError: for a malformed override, an unknown or ambiguous key, a
        ``defenses[i]`` the config does not have.
    """
    # A deep copy, not a YAML dump and reload: safe_dump writes the string "1e5"
    # unquoted (YAML 1.1), and _Loader would read it back as a float.
    raw = copy.deepcopy(raw) or {}
    leaves = _leaf_paths(Config)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected key=value")
        key, text = item.split("=", 1)
        key = key.strip()
        if DEFENSE_KEY.match(key):
            set_defense_param(raw, key, _override_value(text))
            continue
        if key not in leaves and not any(key.startswith(p + ".") for p in ("attack",)):
            matches = [p for p in leaves if p.split(".")[-1] == key]
            if len(matches) == 1:
                key = matches[0]
            elif len(matches) > 1:
                # A bare name means the first section in _BARE_PRIORITY that has it.
                ranked = sorted(matches, key=lambda p: _BARE_PRIORITY.index(p.split(".")[0])
                                if p.split(".")[0] in _BARE_PRIORITY else len(_BARE_PRIORITY))
                key = ranked[0]
            elif any(p.startswith(key + ".") for p in leaves):
                # A section: `--set training={rounds: 1}` was called an unknown key.
                inside = [p for p in leaves if p.startswith(key + ".")]
                raise ConfigError(f"--set {key}: {key} is a section; set one of its keys, "
                                  f"e.g. --set {inside[0]}=... (its keys: {', '.join(inside)})")
            else:
                raise ConfigError(f"--set {key}: unknown config key; known keys: "
                                  f"{', '.join(leaves)}, defenses[i].PARAM"
                                  f"{_key_hint(key, leaves)}")
        value = _override_value(text)
        node = raw
        parts = key.split(".")
        for p in parts[:-1]:
            if not isinstance(node.get(p), dict):
                node[p] = {}
            node = node[p]
        node[parts[-1]] = value
    return raw


def _override_value(text: str):
    """An override's value: its text parsed as YAML, or the text where it is not YAML."""
    try:
        return yaml_load(text)
    except yaml.YAMLError:
        return text


def read_raw_config(path: str | Path) -> dict:
    """The YAML mapping in ``path``, unvalidated.

    Raises:
      ConfigError: for a missing or unparsable file.
    """
    path = Path(path)
    if path.exists() and not path.is_file():
        raise ConfigError(f"config file {path} is a directory or a device, not a file")
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file {path} is not UTF-8 text ({e.reason} at byte "
                          f"{e.start})") from None
    except OSError as e:
        raise ConfigError(f"config file {path} cannot be read: {e.strerror or e}") from None
    try:
        raw = yaml_load(text) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path} is not valid YAML: {str(e).splitlines()[0]}") from None
    except TypeError as e:  # a complex key (``? [a, b]``) builds an unhashable dict key
        raise ConfigError(f"config file {path}: keys must be plain names ({e})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {path} must hold a mapping, got {type(raw).__name__}")
    return raw


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> Config:
    """Load, override and validate a YAML config.

    Raises:
      ConfigError: for a missing/unparsable file or an invalid config.
    """
    raw = read_raw_config(path) if path is not None else {}
    raw = apply_overrides(raw, overrides or [])
    cfg = from_dict(Config, raw)
    validate(cfg)
    return cfg


def validate(cfg: Config) -> None:
    """Cross-field checks that a single field's range cannot express."""
    t, d = cfg.training, cfg.data
    if t.clients_per_round > d.num_clients:
        raise ConfigError(f"config key 'training.clients_per_round': {t.clients_per_round} exceeds "
                          f"data.num_clients = {d.num_clients}")
    if t.algorithm == "fedsgd" and (t.optimizer != "sgd" or t.weight_decay > 0):
        # A FedSGD client sends -lr·g of one full-batch gradient; a client
        # optimizer or weight decay would be ignored without a word.
        key, val = (("optimizer", t.optimizer) if t.optimizer != "sgd"
                    else ("weight_decay", t.weight_decay))
        raise ConfigError(f"config key 'training.{key}': {val!r} applies to FedAvg's local "
                          f"training; a FedSGD client sends one plain gradient step (use "
                          f"training.server_optimizer for momentum or Adam at the server)")
    if t.algorithm == "fedsgd" and t.local_epochs != 1:
        # Ignored without a word: a FedSGD client takes one full-batch step
        # (fedsim.client.LocalTraining), whatever local_epochs says.
        raise ConfigError(f"config key 'training.local_epochs': {t.local_epochs} applies to "
                          "FedAvg's local training; a FedSGD client sends one full-batch "
                          "gradient step (use training.algorithm: fedavg for local epochs)")
    _check_data_source(d)
    _check_server_hyperparameters(t)
    for i, spec in enumerate(cfg.defenses):
        if not isinstance(spec, dict) or "name" not in spec:
            raise ConfigError(f"config key 'defenses[{i}]': expected a mapping with a 'name' key")
    if cfg.pruning.scheme is not None:
        from fedsim.hooks import mask_schemes  # the schemes defenses.pruning registers

        if cfg.pruning.scheme not in mask_schemes():
            raise ConfigError(f"config key 'pruning.scheme': {cfg.pruning.scheme!r} is not "
                              f"allowed; allowed values: {', '.join(mask_schemes())}"
                              f"{did_you_mean(cfg.pruning.scheme, mask_schemes())}")
        from fedsim.hooks import reconfigurable_schemes

        if cfg.pruning.reconfigurations > 1 and \
                cfg.pruning.scheme not in reconfigurable_schemes():
            raise ConfigError(
                f"config key 'pruning.reconfigurations': {cfg.pruning.reconfigurations} needs "
                f"an iterative scheme ({', '.join(reconfigurable_schemes())}); "
                f"{cfg.pruning.scheme!r} makes its mask once, on the initial model")
    for r in cfg.observer.rounds:
        if not 0 <= r < t.rounds:
            raise ConfigError(f"config key 'observer.rounds': round {r} is outside 0..{t.rounds - 1}")
    for c in cfg.observer.clients:
        if not 0 <= c < d.num_clients:
            raise ConfigError(f"config key 'observer.clients': client {c} is outside "
                              f"0..{d.num_clients - 1}")
    if len(set(cfg.observer.clients)) < len(cfg.observer.clients):
        raise ConfigError(f"config key 'observer.clients': {list(cfg.observer.clients)} names a "
                          f"client more than once (it would train twice in one round)")
    if len(cfg.observer.clients) > t.clients_per_round:
        raise ConfigError("config key 'observer.clients': more observed clients than "
                          "training.clients_per_round")
    from fedsim.models import MODEL_REGISTRY
    if cfg.model.name not in MODEL_REGISTRY:
        raise ConfigError(f"config key 'model.name': {cfg.model.name!r} is not allowed; allowed "
                          f"values: {', '.join(sorted(MODEL_REGISTRY))}"
                          f"{did_you_mean(cfg.model.name, MODEL_REGISTRY)}")


#: The training keys of the server optimizer's hyperparameters, by their name
#: in :data:`fedsim.server.SERVER_HYPERPARAMETERS`.
SERVER_HYPERPARAMETER_KEYS = {"momentum": "server_momentum", "b1": "server_b1",
                              "b2": "server_b2", "tau": "server_tau"}


def server_hyperparameters(t: TrainingConfig) -> dict:
    """The server optimizer's hyperparameters the config sets (None: its default)."""
    return {name: getattr(t, key) for name, key in SERVER_HYPERPARAMETER_KEYS.items()}


def _check_server_hyperparameters(t: TrainingConfig) -> None:
    """Refuse a server hyperparameter the chosen server optimizer would ignore."""
    from fedsim.server import SERVER_HYPERPARAMETERS

    takes = SERVER_HYPERPARAMETERS[t.server_optimizer]
    for name, key in SERVER_HYPERPARAMETER_KEYS.items():
        value = getattr(t, key)
        if value is not None and name not in takes:
            users = [n for n, hp in SERVER_HYPERPARAMETERS.items() if name in hp]
            taken = ", ".join(f"training.{SERVER_HYPERPARAMETER_KEYS[k]}" for k in takes)
            raise ConfigError(f"config key 'training.{key}': {value!r} does not apply to "
                              f"training.server_optimizer {t.server_optimizer!r} (it takes "
                              f"{taken or 'none of them'}); it applies to {', '.join(users)}")


def _check_data_source(d: DataConfig) -> None:
    """Refuse data settings the chosen dataset would ignore without a word.

    The synthetic dataset is made in memory from the seed, so a ``source``,
    ``data_dir`` or ``label_key`` set for it changed nothing; Fashion-MNIST's
    IDX files carry their own labels, so ``label_key`` applies to it only
    through tfds.
    """
    if d.dataset == "synthetic":
        for key, value, default in (("source", d.source, "auto"), ("data_dir", d.data_dir, None),
                                    ("label_key", d.label_key, None)):
            if value != default:
                raise ConfigError(f"config key 'data.{key}': {value!r} does not apply to "
                                  f"dataset 'synthetic' (made in memory from the seed); "
                                  f"remove it")
    elif d.dataset == "fashion_mnist" and d.label_key is not None and d.source != "tfds":
        raise ConfigError(f"config key 'data.label_key': {d.label_key!r} applies to tfds data; "
                          f"fashion_mnist with data.source {d.source!r} may read the IDX files, "
                          f"whose labels are the classes (set data.source: tfds to use it)")


def dump_config(cfg: Config) -> str:
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)
