"""Attack-config fuzzing: `fedsim attack` with a mutated `attack` or `defenses`
section never ends in a traceback.

The engine's own fuzz test (tests/fedsim/test_fuzz.py) mutates the simulation's
config; this one mutates what it leaves alone: the attack's name, threat model
and settings, and the defenses' parameters. Every mutated config either runs or
is rejected with one line (exit 1 or 2). Mutations are seeded; a failure names
the seed and the mutations so they can be replayed.
"""

import pytest

from tests.fedsim.helpers import FUZZ_BASE, fuzz_command

BASE = {
    **FUZZ_BASE, "name": "fuzz_attack",
    "data": {**FUZZ_BASE["data"], "examples_per_client": 1, "max_train": 40, "max_test": 20},
    "training": {"algorithm": "fedsgd", "rounds": 1, "clients_per_round": 2, "lr": 0.1,
                 "client_parallelism": "loop"},
    "observer": {"clients": [0, 1], "rounds": [0]},
    "attack": {"name": "inverting_gradients", "grants": {"batch_size": True},
               "config": {"iterations": 3, "restarts": 1, "tv": 0.001, "lr": 0.1}},
    "defenses": [{"name": "gc", "p": 0.3}],
}
WEIRD = [None, -1, 0, 1, 2, 2.5, -3.7, 1e9, "", "zzz", True, False, [], [1, "a"], {}, {"k": 1},
         "1e-3", float("nan"), float("inf"), "dlg", "sgi", "fedavg_inversion", "model_inversion",
         "analytic", "weights", "l2", "lbfgs", "joint", "gaussian", "soteria", "dp_gaussian"]


def _check(seed, tmp_path, capsys):
    fuzz_command("attack", BASE, seed, tmp_path, capsys, WEIRD, roots=("attack", "defenses"))


@pytest.mark.parametrize("seed", range(10))
def test_mutated_attack_configs_never_crash(seed, tmp_path, capsys):
    _check(seed, tmp_path, capsys)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(10, 80))
def test_mutated_attack_configs_never_crash_many(seed, tmp_path, capsys):
    _check(seed, tmp_path, capsys)
