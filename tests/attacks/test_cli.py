"""The attack harness on a tiny synthetic federation."""

import json

import pytest

from attacks.cli import main, validate_attack_section
from fedsim.config import ConfigError, load_config

BASE = ["data.dataset=synthetic", "data.image_size=16", "data.num_clients=8",
        "data.examples_per_client=1", "model.name=mlp", "training.algorithm=fedsgd",
        "training.rounds=1", "training.clients_per_round=2", "training.client_parallelism=loop",
        "observer.clients=[0, 1]", "observer.rounds=[0]", "attack.name=inverting_gradients",
        "attack.grants={batch_size: true}", "attack.config={iterations: 30}",
        "output.plots=false", "output.progress=false"]


@pytest.mark.slow
def test_cli_writes_summary_and_grid(tmp_path):
    rc = main(["configs/attack_quickstart.yaml", "--quiet", "--set", f"output.dir={tmp_path}"]
              + sum((["--set", s] for s in BASE), []))
    assert rc == 0
    summary = json.loads((tmp_path / "attack_summary.json").read_text())
    assert len(summary["victims"]) == 2
    assert set(summary["mean"]) == {"mse", "psnr", "ssim", "label_acc"}
    assert summary["mean"]["label_acc"] == 1.0  # iDLG on batch 1
    assert [v["victims_per_call"] for v in summary["victims"]] == [2, 2]  # one call
    assert (tmp_path / "attack_grid.png").stat().st_size > 0


@pytest.mark.parametrize("override,match", [
    ("attack.name=nope", "attack.name"),
    ("attack.grants={labelz: true}", "attack.grants"),
    ("attack.foo=1", "unknown key"),
    ("observer.clients=[]", "observer.clients"),
])
def test_bad_attack_sections_name_the_key(override, match):
    cfg = load_config("configs/attack_quickstart.yaml", BASE + [override])
    with pytest.raises(ConfigError, match=match):
        validate_attack_section(cfg)


@pytest.mark.parametrize("precision", ["highest", "default"])
def test_the_attack_runs_under_the_configured_precision(tmp_path, monkeypatch, precision):
    import jax

    import attacks.cli as cli
    seen = []

    def recording(uploads, section, key):
        seen.append((len(uploads), jax.config.jax_default_matmul_precision))
        return [{"mse": 0.0, "psnr": 0.0, "ssim": 0.0, "label_acc": 1.0}]

    monkeypatch.setattr(cli, "attack_uploads", recording)
    monkeypatch.setattr(cli, "save_grid", lambda results, path: None)
    cfg = load_config(None, BASE + [f"output.dir={tmp_path}",
                                    f"training.matmul_precision={precision}"])
    # Around it, the other setting: only the harness's own context can set it.
    with jax.default_matmul_precision("default" if precision == "highest" else "highest"):
        cli.run_attack_experiment(cfg, quiet=True)
    assert seen == [(2, precision)]


def test_a_run_checkpointed_past_an_observed_round_is_refused_by_name(tmp_path):
    # A rerun resumes after the observed round and would attack nothing; it
    # failed with "no upload was observed" before.
    from attacks.cli import _check_no_observed_round_is_checkpointed, run_attack_experiment
    from fedsim.run import run_simulation

    sets = BASE + [f"output.dir={tmp_path}", "output.checkpoint_every=1", "training.rounds=2",
                   "observer.rounds=[1]"]
    cfg = load_config("configs/attack_quickstart.yaml",
                      sets + ["training.rounds=1", "observer.rounds=[0]"])
    run_simulation(cfg, quiet=True)  # a checkpoint after round 0 (1 round done)
    _check_no_observed_round_is_checkpointed(load_config("configs/attack_quickstart.yaml", sets))
    late = load_config("configs/attack_quickstart.yaml", sets + ["observer.rounds=[0]"])
    with pytest.raises(ConfigError, match=r"checkpoints holds a checkpoint after 1 rounds, past "
                                          r"observed round 0 \(observer.rounds\)"):
        run_attack_experiment(late)
