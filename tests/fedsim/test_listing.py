"""``fedsim list``: what a config can name, from the registries."""

import subprocess
import sys
from pathlib import Path

from fedsim.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_every_registered_name_is_listed_with_its_config_key(capsys):
    from fedsim.data import KNOWN_DATASETS
    from fedsim.hooks import DEFENSE_REGISTRY, mask_schemes
    from fedsim.models import MODEL_REGISTRY

    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for header in ("models (model.name):", "datasets (data.dataset;", "schemes (pruning.scheme):",
                   "defenses (defenses: [{name: NAME, PARAM: VALUE}]; --set 'defenses[i].PARAM=VALUE'):"):
        assert header in out
    lines = {line.strip() for line in out.splitlines()}
    assert set(MODEL_REGISTRY) <= lines and set(KNOWN_DATASETS) <= lines
    assert set(mask_schemes()) <= lines
    assert len(DEFENSE_REGISTRY) > 10
    for name in DEFENSE_REGISTRY:  # each with its parameters
        assert any(line.startswith(f"{name}(") for line in lines), name
    assert "dp_gaussian(noise_multiplier, clip_norm=1.0, clipping='flat')" in lines
    assert "Example-stage DP-SGD Gaussian defense (001 Alg 1)." in lines
    assert "Classic ReLU LeNet-5 with max pooling." in lines


def test_each_scheme_is_described_and_called_iterative_exactly_when_it_reconfigures():
    from fedsim.hooks import reconfigurable_schemes
    from fedsim.listing import engine_sections

    described = dict(engine_sections()["schemes"])
    assert all(described.values()), described
    for name, text in described.items():
        assert ("iterative (pruning.reconfigurations)" in text) == (
            name in reconfigurable_schemes()), name


def test_one_section_and_a_misspelt_one(capsys):
    assert main(["list", "schemes"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("schemes (pruning.scheme):") and "models" not in out
    assert main(["list", "defnses"]) == 2
    assert "unknown section 'defnses'" in capsys.readouterr().err
    assert main(["list", "defnses"]) == 2 and "did you mean 'defenses'?" in capsys.readouterr().err


def test_the_engines_sections_do_not_import_the_attack_package():
    code = ("import sys, fedsim.listing as l; s = l.engine_sections(); "
            "assert 'attacks' not in sys.modules, 'imported attacks'; print(len(s['defenses']))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu", "PATH": ""})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert int(proc.stdout.strip()) > 10
