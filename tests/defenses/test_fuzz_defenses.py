"""Defense-config fuzzing: `fedsim run` with a mutated `defenses` section never
ends in a traceback.

The engine's fuzz test (tests/fedsim/test_fuzz.py) runs without defenses; here
one defense of each stage family (upload pruning, DP at the example stage,
Soteria at the layer stage, a data channel, PriPrune with its own local
training) is mutated: its name, its
parameters, unknown keys, deletions. Every mutated config either runs or is
rejected with one line (exit 1 or 2), including settings a defense can only
refute once it meets the model or the data, while the round step is traced.
Mutations are seeded; a failure names the seed and the mutations.
"""

import pytest

from tests.fedsim.helpers import FUZZ_BASE, fuzz_command

BASE = {**FUZZ_BASE, "name": "fuzz_defenses"}
DEFENSES = [
    [{"name": "prune_largest", "p": 0.3, "pseudo": True}],
    [{"name": "dp_gaussian", "noise_multiplier": 1.0, "clip_norm": 1.0}],
    [{"name": "soteria", "p_fc": 0.3, "layer": "Dense_0"}],
    [{"name": "parameter_channel", "kappa": 100.0}, {"name": "gc", "p": 0.5}],
    [{"name": "dp_vmf", "kappa": 50.0, "clipping": "per_layer"}],
    [{"name": "priprune", "lambda_pri": 10.0, "upload": "weights"}],  # its own local training
]
WEIRD = [None, -1, 0, 1, 0.5, 2.5, 1e9, "", "zzz", True, False, [], [1, "a"], {}, {"k": 1},
         "1e-3", float("nan"), float("inf"), "gc", "soteria", "dp_gaussian", "update_laplace",
         "prune_mix", "priprune", "Dense_1", "Conv_0", "per_layer", "flat", "weights", "code"]


def _check(seed, tmp_path, capsys):
    base = {**BASE, "defenses": DEFENSES[seed % len(DEFENSES)]}
    fuzz_command("run", base, seed, tmp_path, capsys, WEIRD, roots=("defenses",))


@pytest.mark.parametrize("seed", range(10))
def test_mutated_defenses_never_crash(seed, tmp_path, capsys):
    _check(seed, tmp_path, capsys)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(10, 100))
def test_mutated_defenses_never_crash_many(seed, tmp_path, capsys):
    _check(seed, tmp_path, capsys)
