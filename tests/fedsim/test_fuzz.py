"""Config fuzzing: random mutations of a valid config never end in a traceback.

Every mutated config either runs or is rejected with a clear error
(ConfigError / DatasetError / CheckpointError, i.e. `fedsim run` exits 1 or 2
with a one-line message). Mutations are seeded; a failure names the seed and
the mutation so it can be replayed.
"""

import pytest
import yaml

from fedsim.cli import main
from tests.fedsim.helpers import FUZZ_BASE, fuzz_command

BASE = FUZZ_BASE
WEIRD = [None, -1, 0, 1, 2.5, -3.7, 1e9, "", "zzz", True, [], [1, "a"], {}, {"k": 1}, "1e-3",
         float("nan"), "lenet5", "dirichlet", "vmap", "sharded"]


def _run_cli(tmp_path, cfg, capsys):
    p = tmp_path / "cfg.yaml"
    p.write_text(yaml.safe_dump(cfg))
    rc = main(["run", str(p), "--quiet", "--set", f"output.dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    return rc, err


@pytest.mark.parametrize("seed", range(12))
def test_mutated_configs_never_crash(seed, tmp_path, capsys):
    fuzz_command("run", BASE, seed, tmp_path, capsys, WEIRD)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(12, 80))
def test_mutated_configs_never_crash_many(seed, tmp_path, capsys):
    test_mutated_configs_never_crash(seed, tmp_path, capsys)


@pytest.mark.parametrize("defenses,named", [
    # Settings only the model or the data can refute: the defense finds out when
    # the round step is traced, and the message names the config entry.
    ([{"name": "gc", "p": 0.5}, {"name": "soteria", "p_fc": 0.3, "layer": "Nope_9"}],
     "config key 'defenses[1]' (soteria): soteria layer 'Nope_9': no 'Nope_9'"),
    ([{"name": "natural_channel", "kappa": 10.0, "dataset": "synthetic", "image_size": 16}],
     "config key 'defenses[0]' (natural_channel): natural_channel: inputs have example shape "
     "(8, 8, 1), but the channel was calibrated for (16, 16, 1)"),
])
def test_a_defense_that_does_not_fit_the_model_or_data_is_named(tmp_path, capsys, defenses, named):
    rc, err = _run_cli(tmp_path, {**BASE, "defenses": defenses}, capsys)
    assert rc == 2
    assert err.startswith(f"fedsim: config error: {named}"), err
    assert "Traceback" not in err


def test_a_defense_name_that_is_not_a_string_is_named(tmp_path, capsys):
    # Once a TypeError from the registry lookup (unhashable list); found by
    # the attack fuzzer (tests/attacks/test_fuzz_attack.py).
    rc, err = _run_cli(tmp_path, {**BASE, "defenses": [{"name": ["gc"], "p": 0.3}]}, capsys)
    assert rc == 2
    assert err.startswith("fedsim: config error: config key 'defenses[0]': unknown defense ['gc']")
