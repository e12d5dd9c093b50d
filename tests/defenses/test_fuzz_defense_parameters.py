"""`fedsim run` with every parameter of every registered defense at type-correct
edge values (slow: ~320 runs per strategy, ~8 min each on 2 cores).

Where tests/defenses/test_fuzz_defenses.py mutates a few defenses at random,
this walks every parameter: floats at 0, −1, 1e-30, 1, 1e30, NaN and ∞; ints
at 0, −1, 1 and 1e9; strings at "" and "zzz"; booleans both ways. Each run
either trains or stops with a one-line ``fedsim:`` message, and a negative, NaN,
infinite or unknown-string value is never accepted silently.
"""

import inspect
import math

import pytest
import yaml

from fedsim import hooks
from fedsim.cli import main
from tests.defenses.test_defense_parameters import REQUIRED

BASE = {"name": "fuzz_parameters", "seed": 0,
        "data": {"dataset": "synthetic", "num_clients": 4, "partition": "iid", "image_size": 12,
                 "max_train": 120, "max_test": 40},
        "model": {"name": "lenet5"},
        "training": {"rounds": 1, "clients_per_round": 2, "batch_size": 8, "lr": 0.1},
        "eval": {"every": 1}, "output": {"progress": False, "plots": False}}
EDGE = {"float": [0.0, -1.0, 1e-30, 1.0, 1e30, float("nan"), float("inf")],
        "int": [0, -1, 1, 10**9], "str": ["", "zzz"], "bool": [True, False]}
NEVER_ACCEPTED = (-1, "", "zzz")
SKIP = {"statistics", "data"}  # arrays, not config values


def _cases(name):
    factory = hooks.DEFENSE_REGISTRY[name]
    for p in inspect.signature(factory).parameters.values():
        if p.name in SKIP or p.kind is inspect.Parameter.VAR_KEYWORD:
            continue
        kind = next((k for k in ("float", "int", "str", "bool") if k in str(p.annotation)), None)
        for value in EDGE.get(kind, EDGE["float"] + EDGE["str"]):
            yield p.name, value


hooks._load_defenses()


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["loop", "vmap"])
@pytest.mark.parametrize("name", sorted(hooks.DEFENSE_REGISTRY))
def test_every_parameter_at_its_edges_runs_or_is_named(name, strategy, tmp_path, capsys):
    problems = []
    for param, value in _cases(name):
        cfg = {**BASE, "training": {**BASE["training"], "client_parallelism": strategy},
               "defenses": [{"name": name, **REQUIRED.get(name, {}), param: value}]}
        path = tmp_path / "cfg.yaml"
        path.write_text(yaml.safe_dump(cfg))
        try:
            rc = main(["run", str(path), "--quiet", "--set", f"output.dir={tmp_path / 'run'}"])
        except Exception as e:  # a traceback is exactly what must not happen
            problems.append(f"{param}={value!r}: {type(e).__name__}: {e}")
            continue
        err = capsys.readouterr().err
        lines = [l for l in err.splitlines() if l.strip()]
        if rc not in (0, 1, 2):
            problems.append(f"{param}={value!r}: exit {rc}")
        elif rc and (not lines or not lines[-1].startswith("fedsim: ") or "Traceback" in err):
            problems.append(f"{param}={value!r}: exit {rc} without a one-line message: {err[-300:]}")
        elif rc == 0 and not isinstance(value, bool) and (
                value in NEVER_ACCEPTED or (isinstance(value, float) and not math.isfinite(value))):
            problems.append(f"{param}={value!r}: accepted")
    assert not problems, problems
