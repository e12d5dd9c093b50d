"""The attack harness on a tiny synthetic federation."""

import json
import re

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
    assert set(summary["mean"]) == {"mse", "psnr", "ssim", "nmi", "label_acc", "ami"}
    assert summary["scored"] == {k: 2 for k in summary["mean"]}
    assert summary["mean"]["label_acc"] == 1.0  # iDLG on batch 1
    assert [v["victims_per_call"] for v in summary["victims"]] == [2, 2]  # one call
    assert (tmp_path / "attack_grid.png").stat().st_size > 0


@pytest.mark.parametrize("override,match", [
    ("attack.name=nope", "attack.name"),
    ("attack.name={k: 1}", "attack.name"),  # once a TypeError (unhashable) from the lookup
    ("attack.grants={labelz: true}", "attack.grants"),
    ("attack.foo=1", "unknown key"),
    ("observer.clients=[]", "observer.clients"),
    # The attack's own settings (each attack's check_config), before anything runs.
    ("attack.config={restarts: 0}", r"attack\.config\.restarts: must be a positive integer "
                                    r"\(at most 2\*\*31 - 1\), got 0"),
    # Once accepted, then an OverflowError in the jitted loop after simulating.
    ("attack.config={iterations: 3000000000}", r"attack\.config\.iterations: must be a positive "
                                               r"integer \(at most"),
    ("attack.config={iterations: 30, lr: .nan}", r"attack\.config\.lr: must be a finite"),
    ("attack.config={tv: -1.0}", r"attack\.config\.tv: must be a finite non-negative"),
    ("attack.config={signed: 'yes'}", r"attack\.config\.signed: must be true or false"),
    ("attack.config={iteratons: 3}", r"attack\.config: unknown key\(s\) \['iteratons'\]"),
    ("attack.config={batch_size: 0}", r"attack\.config\.batch_size: must be a positive integer"),
    ("attack.config={victims_per_call: 2.5}", r"attack\.config\.victims_per_call"),
    (["attack.name=dlg", "attack.config={optimizer: sgd}"],
     r"attack\.config\.optimizer: 'sgd' is not allowed"),
    (["attack.name=sgi", "attack.config={upload: grads}"],
     r"attack\.config\.upload: 'grads' is not allowed"),
    (["attack.name=fedavg_inversion", "attack.config={local_steps: 0}"],
     r"attack\.config\.local_steps: must be a positive integer"),
    (["attack.name=fedavg_inversion", "attack.config={restarts: -2}"],
     r"attack\.config\.restarts"),
    # What the threat model must grant (or the config assume) for the attack to run.
    ("attack.grants={}", r"the victim's batch size is unknown: grant 'batch_size'"),
    (["attack.name=sgi", "attack.grants={labels: true}"], r"batch size is unknown"),
    # FedAvg: a granted batch size is the attacked batch only after one local step.
    (["training.algorithm=fedavg", "attack.grants={batch_size: true}"],
     r"under training\.algorithm=fedavg the granted 'batch_size' is the attacked batch only "
     r"after one local step, .* grant 'num_examples'"),
    (["training.algorithm=fedavg", "attack.name=dlg", "attack.grants={batch_size: true}"],
     r"training\.algorithm=fedavg"),
    (["attack.name=fedavg_inversion", "attack.grants={batch_size: true, local_steps: true}"],
     r"fedavg_inversion needs the victim's num_examples: grant 'num_examples' in the threat "
     r"model \(attack.grants\) or set attack\.config\.num_examples"),
    (["attack.name=model_inversion", "attack.config={iterations: 5}"],
     r"needs attack\.config\.aux_images"),
    (["attack.name=model_inversion", "attack.config={aux_images: [0.5], model: both}"],
     r"attack\.config\.model: 'both' is not allowed"),
    (["attack.name=model_inversion", "attack.config={aux_images: [0.5], lr: 0}"],
     r"attack\.config\.lr: must be a finite positive"),
    (["attack.name=model_inversion", "attack.config={aux_images: [0.5], classes: [-1]}"],
     r"attack\.config\.classes"),
    # Valid settings, but one image per class is not the client's batch: refused before
    # anything is simulated (it used to crash on a shape mismatch after simulating).
    (["attack.name=model_inversion", "attack.config={aux_images: [0.5]}"],
     r"'attack\.name': 'model_inversion' does not reconstruct the client's batch"),
    # Standardised inputs: a [0, 1] reconstruction used to be scored against a
    # standardised image (PSNR ~3 dB however good the reconstruction).
    ("data.normalize=true", r"'data\.normalize': true standardises the inputs, but `fedsim "
                            r"attack` reconstructs and scores \[0, 1\] images"),
])
def test_bad_attack_sections_name_the_key(override, match):
    overrides = override if isinstance(override, list) else [override]
    cfg = load_config("configs/attack_quickstart.yaml", BASE + overrides)
    with pytest.raises(ConfigError, match=match):
        validate_attack_section(cfg)


@pytest.mark.parametrize("name", ["inverting_gradients", "dlg", "sgi", "fedavg_inversion"])
def test_every_attacks_defaults_pass_its_check(name):
    every = "attack.grants={batch_size: true, num_examples: true, local_steps: true}"
    cfg = load_config("configs/attack_quickstart.yaml",
                      BASE + [f"attack.name={name}", "attack.config={}", every])
    assert validate_attack_section(cfg)["config"] == {}


@pytest.mark.parametrize("grants", ["{num_examples: true}", "{batch_size: true, local_steps: true}"])
def test_what_a_fedavg_upload_needs_granted(grants):
    cfg = load_config("configs/attack_quickstart.yaml",
                      BASE + ["training.algorithm=fedavg", f"attack.grants={grants}"])
    validate_attack_section(cfg)


def test_a_fedavg_run_whose_batch_size_grant_is_not_enough_stops_before_it_simulates(
        tmp_path, capsys):
    """Before, the check passed and the attack failed after the observed rounds."""
    from fedsim.cli import main as fedsim_main

    out = tmp_path / "run"
    rc = fedsim_main(["attack", "configs/attack_quickstart.yaml", "--quiet", "--set",
                      f"output.dir={out}"] + sum((["--set", s] for s in BASE), [])
                     + ["--set", "training.algorithm=fedavg"])
    assert rc == 2
    assert "training.algorithm=fedavg" in capsys.readouterr().err
    assert not (out / "metrics.jsonl").exists()


@pytest.mark.parametrize("name,config", [
    ("inverting_gradients", "{batch_size: 1}"),
    ("fedavg_inversion", "{num_examples: 1, local_batch: 1, local_steps: 1}"),
])
def test_what_is_not_granted_may_be_assumed_in_the_config(name, config):
    cfg = load_config("configs/attack_quickstart.yaml",
                      BASE + [f"attack.name={name}", "attack.grants={}", f"attack.config={config}"])
    validate_attack_section(cfg)


def test_a_bad_attack_setting_stops_the_command_before_it_simulates(tmp_path, capsys):
    from fedsim.cli import main as fedsim_main

    out = tmp_path / "run"
    rc = fedsim_main(["attack", "configs/attack_quickstart.yaml", "--quiet", "--set",
                      f"output.dir={out}"] + sum((["--set", s] for s in BASE), [])
                     + ["--set", "attack.config={restarts: 0}"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "fedsim: config error: attack.config.restarts: must be a positive integer" in err
    assert "Traceback" not in err
    assert not (out / "metrics.jsonl").exists()  # named before the simulation, not after


@pytest.mark.parametrize("precision", ["highest", "default"])
def test_the_attack_runs_under_the_configured_precision(tmp_path, monkeypatch, precision):
    import jax

    import attacks.cli as cli
    seen = []

    def recording(uploads, section, key):
        seen.append((len(uploads), jax.config.jax_default_matmul_precision))
        return [{"client": 0, "round": 0, "mse": 0.0, "psnr": 0.0, "ssim": 0.0, "nmi": 0.0,
                 "label_acc": 1.0}]

    monkeypatch.setattr(cli, "attack_uploads", recording)
    monkeypatch.setattr(cli, "save_grid", lambda results, path: None)
    cfg = load_config(None, BASE + [f"output.dir={tmp_path}",
                                    f"training.matmul_precision={precision}"])
    # Around it, the other setting: only the harness's own context can set it.
    with jax.default_matmul_precision("default" if precision == "highest" else "highest"):
        cli.run_attack_experiment(cfg, quiet=True)
    assert seen == [(2, precision)]


def test_a_run_checkpointed_past_an_observed_round_it_did_not_store_is_refused_by_name(tmp_path):
    # A plain `fedsim run` stores no observations: resuming it past the observed
    # round would attack nothing (this failed with "no upload was observed" once).
    from attacks.cli import run_attack_experiment
    from fedsim.run import run_simulation

    sets = BASE + [f"output.dir={tmp_path}", "output.checkpoint_every=1"]
    run_simulation(load_config("configs/attack_quickstart.yaml", sets), quiet=True)
    late = load_config("configs/attack_quickstart.yaml", sets + ["training.rounds=2"])
    with pytest.raises(ConfigError, match=r"checkpoints holds a checkpoint after 1 rounds, past "
                                          r"observed round 0 \(observer.rounds\), and that round's "
                                          r"stored observations cannot be read: .*round_000000\.npz "
                                          r"does not exist"):
        run_attack_experiment(late)


RESUMABLE = BASE + ["output.checkpoint_every=1", "training.rounds=3", "observer.rounds=[0, 2]",
                    "attack.config={iterations: 30, restarts: 1}"]


def _attack(directory, *extra):
    from attacks.cli import run_attack_experiment

    cfg = load_config("configs/attack_quickstart.yaml", RESUMABLE + [f"output.dir={directory}",
                                                                      *extra])
    return run_attack_experiment(cfg, quiet=True)


def _numbers(summary):
    return [(v["client"], v["round"], v["mse"], v["psnr"], v["loss"]) for v in summary["victims"]]


def test_a_killed_attack_run_resumes_from_its_stored_observations(tmp_path, monkeypatch):
    from fedsim.simulation import Simulation

    whole = _attack(tmp_path / "whole")
    assert whole["rounds_from_disk"] == []
    assert list(whole["mean_by_round"]) == ["0", "2"]
    for r, means in whole["mean_by_round"].items():
        assert means["psnr"] == pytest.approx(
            sum(v["psnr"] for v in whole["victims"] if v["round"] == int(r)) / 2, rel=1e-12)
    assert sorted((tmp_path / "whole" / "observations").iterdir()) == [
        tmp_path / "whole" / "observations" / f"round_00000{r}.npz" for r in (0, 2)]
    run_round = Simulation.run_round

    def killed_in_round_2(self, state, round_idx):
        if round_idx == 2:
            raise KeyboardInterrupt  # as a kill after round 1's checkpoint
        return run_round(self, state, round_idx)

    monkeypatch.setattr(Simulation, "run_round", killed_in_round_2)
    with pytest.raises(KeyboardInterrupt):
        _attack(tmp_path / "killed")
    monkeypatch.setattr(Simulation, "run_round", run_round)
    resumed = _attack(tmp_path / "killed")
    assert resumed["rounds_from_disk"] == [0]  # round 2 simulated again, round 0 read
    assert _numbers(resumed) == _numbers(whole)
    assert "resumed from" in (tmp_path / "killed" / "run.log").read_text()


def test_a_defenses_whole_number_written_as_a_float_resumes_the_run_written_as_an_int(tmp_path):
    # YAML reads `clip_norm: 1` as an int and `clip_norm: 1.0` as a float; both build
    # the same defense, so the second command resumes the first's simulation and
    # attacks its stored observations (before 2026-11-29: "different config").
    noise = "defenses=[{name: update_gaussian, sigma: 0.001, clip_norm: %s}]"
    first = _attack(tmp_path / "run", noise % "1")
    again = _attack(tmp_path / "run", noise % "1.0")
    assert again["rounds_from_disk"] == [0, 2]
    assert _numbers(again) == _numbers(first)
    from fedsim.checkpoint import CheckpointError
    with pytest.raises(CheckpointError, match="different config"):
        _attack(tmp_path / "run", noise % "2")


def test_an_attack_that_fails_on_a_rerun_leaves_no_earlier_summary(tmp_path, monkeypatch):
    # Before: config.yaml held the new attack section and attack_summary.json the
    # old attack's numbers, which report, compare and sweeps read as the new one's.
    import attacks.cli as cli
    score = [{"client": 0, "round": 0, "mse": 0.0, "psnr": 0.0, "ssim": 0.0, "nmi": 0.0,
              "label_acc": 1.0}]
    monkeypatch.setattr(cli, "attack_uploads", lambda uploads, section, key: score)
    monkeypatch.setattr(cli, "save_grid", lambda results, path: path.write_bytes(b"png"))
    # Checkpointed: the rerun finds the simulation finished and only attacks again.
    cfg = lambda *o: load_config(None, BASE + [f"output.dir={tmp_path}",
                                               "output.checkpoint_every=1", *o])
    cli.run_attack_experiment(cfg(), quiet=True)
    assert (tmp_path / "attack_summary.json").exists() and (tmp_path / "attack_grid.png").exists()

    def fails(uploads, section, key):
        raise FloatingPointError("every restart ended NaN")

    monkeypatch.setattr(cli, "attack_uploads", fails)
    with pytest.raises(FloatingPointError):
        cli.run_attack_experiment(cfg("attack.config={iterations: 5}"), quiet=True)
    assert "iterations: 5" in (tmp_path / "config.yaml").read_text()
    assert not (tmp_path / "attack_summary.json").exists()
    assert not (tmp_path / "attack_grid.png").exists()


def test_a_finished_attack_run_is_attacked_again_without_simulating(tmp_path, capsys):
    first = _attack(tmp_path / "run")
    from fedsim.cli import main as fedsim_main
    assert fedsim_main(["report", str(tmp_path / "run")]) == 0  # the victims' table too
    table = capsys.readouterr().out.split("attack inverting_gradients")[1].splitlines()
    assert [tuple(map(int, line.split()[:2])) for line in table[2:-1]] == [
        (c, r) for r in (0, 2) for c in (0, 1)]
    metrics = (tmp_path / "run" / "metrics.jsonl").read_text()
    again = _attack(tmp_path / "run")
    assert again["rounds_from_disk"] == [0, 2]
    assert _numbers(again) == _numbers(first)
    # What the numbers came from besides the config (the code, JAX, the device,
    # the convolution rule) is recorded with them.
    from fedsim.provenance import environment
    assert again["environment"] == first["environment"] == environment()
    # Other attack settings take effect, and nothing is simulated. (That they give
    # a fresh run's numbers: test_an_attack_sweep_over_attack_settings_simulates_once.)
    changed = _attack(tmp_path / "run", "attack.config={iterations: 10, restarts: 1}")
    assert changed["config"]["iterations"] == 10 and changed["rounds_from_disk"] == [0, 2]
    assert _numbers(changed) != _numbers(first)
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == metrics
    assert (tmp_path / "run" / "run.log").read_text().count("resumed from") == 2
    # Settings that change the simulation are refused by the checkpoint, by name.
    from fedsim.checkpoint import CheckpointError
    with pytest.raises(CheckpointError, match="different config"):
        _attack(tmp_path / "run", "training.lr=0.2")


def test_an_attack_sweep_tabulates_each_cells_attack_and_resumes_an_unattacked_cell(tmp_path):
    from attacks.cli import run_attack_sweep

    sets = BASE + ["defenses=[{name: dp_gaussian, noise_multiplier: 0.0, clip_norm: 1.0}]"]
    grid = ["defenses[0].noise_multiplier=0.0,0.1"]
    rows = run_attack_sweep("configs/attack_quickstart.yaml", grid, tmp_path, sets, log=lambda m: None)
    assert [r["status"] for r in rows] == ["done", "done"]
    cells = [tmp_path / "cells" / r["cell"] for r in rows]
    for row, cell in zip(rows, cells):
        attacked = json.loads((cell / "attack_summary.json").read_text())
        assert [row[f"attack_{k}"] for k in ("psnr", "nmi")] == [attacked["mean"][k] for k in ("psnr", "nmi")]
        assert row["test_accuracy"] == json.loads((cell / "summary.json").read_text())["test_accuracy"]
    assert rows[1]["attack_psnr"] < rows[0]["attack_psnr"] - 10  # noise hides the input
    assert rows[1]["epsilon"] > 0 and rows[0].get("epsilon") is None
    # A cell killed while attacking (simulated, not attacked) is attacked again
    # from its stored observations; the finished one is skipped.
    (cells[1] / "attack_summary.json").unlink()
    again = run_attack_sweep("configs/attack_quickstart.yaml", grid, tmp_path, sets, log=lambda m: None)
    assert [r["status"] for r in again] == ["done (skipped)", "done"]
    assert json.loads((cells[1] / "attack_summary.json").read_text())["rounds_from_disk"] == [0]
    assert [r["attack_psnr"] for r in again] == [r["attack_psnr"] for r in rows]
    table = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert [r["attack_mse"] for r in table] == [r["attack_mse"] for r in rows]
    assert (tmp_path / "privacy_utility.png").stat().st_size > 0


def test_an_attack_sweep_checks_every_cells_attack_before_running_any(tmp_path):
    from attacks.cli import run_attack_sweep

    with pytest.raises(ConfigError, match="'attack.name': 'nope' is not allowed"):
        run_attack_sweep("configs/attack_quickstart.yaml", ["attack.name=dlg,nope"], tmp_path, BASE,
                         log=lambda m: None)
    assert not (tmp_path / "cells").exists()


def test_out_without_grid_is_refused(tmp_path, capsys):
    assert main(["configs/attack_quickstart.yaml", "--out", str(tmp_path)]) == 2
    assert "--out names a sweep's directory: it takes --grid" in capsys.readouterr().err


def test_an_attack_sweep_over_attack_settings_simulates_once(tmp_path):
    from attacks.cli import run_attack_sweep

    logs = []
    sets = BASE + ["training.rounds=3", "observer.rounds=[0, 2]"]
    rows = run_attack_sweep("configs/attack_quickstart.yaml", ["attack.config.iterations=10,20"],
                            tmp_path, sets, log=logs.append)
    assert [r["status"] for r in rows] == ["done", "done"]
    assert "  attack.config.iterations=20: starts from cell attack.config.iterations=10's " \
           "simulation (3 rounds done)" in logs
    first, second = (tmp_path / "cells" / r["cell"] for r in rows)
    assert json.loads((second / "attack_summary.json").read_text())["rounds_from_disk"] == [0, 2]
    assert (second / "metrics.jsonl").read_text() == (first / "metrics.jsonl").read_text()
    # The same numbers as a run of its own that simulates.
    alone = _attack(tmp_path / "alone", "attack.config={iterations: 20}")
    assert alone["rounds_from_disk"] == []
    assert _numbers(json.loads((second / "attack_summary.json").read_text())) == _numbers(alone)
    assert rows[1]["test_accuracy"] == rows[0]["test_accuracy"]


def test_a_mean_that_leaves_nan_scores_out_says_over_how_many_victims():
    from attacks.cli import ATTACK_MEANS, _left_out, _means, _scored

    victims = [{k: 1.0 for k in ATTACK_MEANS}, {k: 3.0 for k in ATTACK_MEANS},
               {**{k: 5.0 for k in ATTACK_MEANS}, "nmi": float("nan")}]
    summary = {"victims": victims, "mean": _means(victims), "scored": _scored(victims)}
    assert summary["mean"]["nmi"] == 2.0 and summary["mean"]["psnr"] == 3.0
    assert summary["scored"] == {**{k: 3 for k in ATTACK_MEANS}, "nmi": 2}
    assert _left_out(summary) == " (NaN scores left out: nmi over 2 of 3)"
    assert _left_out({**summary, "victims": victims[:2], "scored": _scored(victims[:2])}) == ""


def test_an_attack_sweep_table_says_where_a_mean_leaves_victims_out(tmp_path):
    from attacks.cli import ATTACK_MEANS, ATTACK_TABLE_FIELDS, _means, _scored, _sweep_row
    from fedsim.sweep import write_table

    victims = [{k: 1.0 for k in ATTACK_MEANS}, {**{k: 3.0 for k in ATTACK_MEANS},
                                                 "ssim": float("nan")}]
    attacked = {"victims": victims, "mean": _means(victims), "scored": _scored(victims),
                "seconds": 1.5}
    run = {"cell": "a", "status": "done", "seed": 0}
    short = _sweep_row(run, attacked)
    full = _sweep_row({**run, "cell": "b", "seed": 1},
                      {**attacked, "victims": victims[:1], "scored": _scored(victims[:1])})
    old = _sweep_row({**run, "cell": "c", "seed": 2},  # written before "scored" existed
                     {k: v for k, v in attacked.items() if k != "scored"})
    assert short["attack_left_out"] == "ssim over 1 of 2"
    assert "attack_left_out" not in full and "attack_left_out" not in old
    write_table(tmp_path, ["seed"], [short, full, old], ATTACK_TABLE_FIELDS)
    table = (tmp_path / "results.md").read_text().splitlines()
    assert table[0].endswith("| attack_seconds | attack_left_out |")
    assert table[2].endswith("| 1.5 | ssim over 1 of 2 |") and table[3].endswith("| 1.5 |  |")


def test_an_observed_clients_reconstruction_does_not_depend_on_who_else_is_observed():
    """Each client's key is its id's: before, victim i of a round's call took the
    call's i-th key, so observing clients [0, 1] or [1] gave client 1 another start,
    and so another reconstruction (this test fails on the commit before)."""
    import jax
    import numpy as np

    from attacks.api import observation_from_gradient
    from attacks.cli import attack_uploads
    from fedsim.client import masked_mean_loss
    from fedsim.models import build_model, init_params, make_apply_fn
    from fedsim.observer import ObservedUpload

    model = build_model("mlp", 10)
    f = make_apply_fn(model)
    p = init_params(model, (8, 8, 1), jax.random.key(0))
    rng = np.random.default_rng(0)
    uploads = []
    for client in (0, 1):
        x = rng.random((1, 8, 8, 1)).astype(np.float32)
        y = rng.integers(0, 10, 1).astype(np.int32)
        g = jax.grad(masked_mean_loss, argnums=1)(f, p, x, y, np.ones(1))
        obs = observation_from_gradient(g, p, f, input_shape=(8, 8, 1), num_classes=10,
                                        lr=0.1, batch_size=1)._replace(client_id=client, round=0)
        uploads.append(ObservedUpload(obs, x, y))
    section = {"name": "inverting_gradients", "grants": {"batch_size": True},
               "config": {"iterations": 5, "restarts": 1}}
    key = jax.random.key(7)
    both = attack_uploads(uploads, section, key)
    alone = attack_uploads(uploads[1:], section, key)
    assert [r["client"] for r in both] == [0, 1] and alone[0]["client"] == 1
    np.testing.assert_allclose(both[1]["_rec"], alone[0]["_rec"], atol=1e-6)
    assert both[1]["labels_rec"] == alone[0]["labels_rec"]


@pytest.mark.parametrize("config,said", [
    ("{iterations: 1, batch_size: 3}", r"is not the client's 1 examples; check attack\.config\."
                                       r"batch_size"),
    ("{iterations: 1, last_layer: nope}", r"attack\.config\.last_layer: 'nope' is not a module"),
])
def test_an_attack_setting_the_victims_contradict_is_one_line_through_fedsim(
        tmp_path, capsys, config, said):
    # Before: a ValueError traceback from `fedsim attack` (one line only through
    # python -m attacks.cli).
    from fedsim.cli import main as fedsim_main

    argv = ["attack", "configs/attack_quickstart.yaml", "--quiet",
            "--set", f"output.dir={tmp_path}"] + sum((["--set", s] for s in BASE), [])
    assert fedsim_main(argv + ["--set", f"attack.config={config}"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert re.search(said, err)
