import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fedsim.cli import main
from fedsim.config import ConfigError, load_config
from fedsim.simulation import build_defenses

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"


@pytest.mark.parametrize("override,pattern", [
    ("rounds=abc", r"'training.rounds': expected an integer, got 'abc'"),
    ("training.lr=-1", r"'training.lr'.*must be > 0"),
    ("data.partition=blocks", r"'data.partition'.*allowed values: iid, dirichlet, shards, natural"),
    ("nonsense=1", r"unknown config key"),
    ("model.name=resnet99", r"'model.name'.*allowed values:.*lenet5"),
    ("clients_per_round=1000", r"clients_per_round"),
    # JAX keys keep 32 bits: 2**32 would repeat seed 0's init and cohorts.
    ("seed=4294967296", r"'seed': 4294967296 is out of range; must be <= 4294967295"),
    ("training.lr=.inf", r"'training.lr': inf is not a finite number"),
    ("training.server_lr=1e400", r"'training.server_lr': inf is not a finite number"),
    ("data.alpha=.inf", r"'data.alpha': inf is not a finite number"),
])
def test_bad_overrides_name_the_key(override, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_config(QUICKSTART, [override])


DP_FEDAVG = ROOT / "configs" / "dp_fedavg.yaml"


def test_set_reaches_a_defense_parameter_as_grid_does():
    # Before, only `fedsim sweep --grid` took defenses[i].PARAM; --set refused it.
    cfg = load_config(DP_FEDAVG, ["defenses[0].noise_multiplier=2", "defenses[0].clip_norm=1e-1"])
    assert cfg.defenses[0] == {"name": "client_level_dp", "clip_norm": 0.1,
                               "noise_multiplier": 2, "clients_per_round": 10}
    assert load_config(DP_FEDAVG).defenses[0]["noise_multiplier"] == 1.0  # the file is not changed
    # The name too: a parameter the new defense does not take is named when it is built.
    swapped = load_config(DP_FEDAVG, ["defenses[0].name=dp_gaussian"])
    with pytest.raises(ConfigError, match=r"'defenses\[0\]'.*clients_per_round"):
        build_defenses(swapped.defenses)


@pytest.mark.parametrize("override,pattern", [
    ("defenses[1].clip_norm=1", r"^--set defenses\[1\].clip_norm: the config has no defenses\[1\] "
                                r"\(it has 1: defenses\[0\] = 'client_level_dp'\)$"),
    ("defenses.0.clip_norm=1", r"unknown config key.*defenses\[i\]\.PARAM; "
                               r"did you mean 'defenses\[0\].clip_norm'\?$"),
    ("defenses[0]clip_norm=1", r"did you mean 'defenses\[0\].clip_norm'\?$"),
    ("defenses[0].clip_nrom=1", r"'defenses\[0\]'.*did you mean 'clip_norm'\?"),
    ("defenses[0].clip_norm=-1", r"'defenses\[0\]'.*clip_norm"),
])
def test_a_bad_defense_override_names_the_key(override, pattern):
    with pytest.raises(ConfigError, match=pattern):
        build_defenses(load_config(DP_FEDAVG, [override]).defenses)


def test_a_defense_override_on_a_config_without_defenses_says_it_has_none():
    with pytest.raises(ConfigError, match=r"no defenses\[0\] \(it has none\)"):
        load_config(QUICKSTART, ["defenses[0].sigma=1"])


@pytest.mark.parametrize("overrides,pattern", [
    (["data.dataset=synthetic", "data.source=tfds"],
     r"'data.source': 'tfds' does not apply to dataset 'synthetic'"),
    (["data.dataset=synthetic", "data.data_dir=/x"],
     r"'data.data_dir': '/x' does not apply to dataset 'synthetic'"),
    (["data.dataset=synthetic", "data.label_key=label"],
     r"'data.label_key': 'label' does not apply to dataset 'synthetic'"),
    (["data.dataset=fashion_mnist", "data.label_key=label"],
     r"'data.label_key': 'label' applies to tfds data.*data.source 'auto'"),
])
def test_data_settings_the_dataset_would_ignore_are_refused(overrides, pattern):
    # Before, each was accepted and changed nothing.
    with pytest.raises(ConfigError, match=pattern):
        load_config(QUICKSTART, overrides)
    assert load_config(QUICKSTART, ["data.dataset=fashion_mnist", "data.label_key=label",
                                    "data.source=tfds"]).data.label_key == "label"


@pytest.mark.parametrize("overrides,pattern", [
    (["training.server_b2=0.5"],
     r"^config key 'training.server_b2': 0.5 does not apply to training.server_optimizer 'sgd' "
     r"\(it takes none of them\); it applies to adam, yogi, fedadam, fedyogi$"),
    (["training.server_optimizer=fedadagrad", "training.server_b2=0.5"],
     r"'training.server_b2'.*'fedadagrad' \(it takes training.server_b1, training.server_tau\)"),
    (["training.server_optimizer=adam", "training.server_momentum=0.5"],
     r"'training.server_momentum'.*it applies to momentum$"),
    (["training.server_optimizer=momentum", "training.server_tau=0.1"],
     r"'training.server_tau'.*'momentum' \(it takes training.server_momentum\)"),
    (["training.server_optimizer=fedyogi", "training.server_b1=1"],
     r"'training.server_b1': 1.0 is out of range; must be < 1.0"),
    (["training.server_optimizer=fedadam", "training.server_tau=0"],
     r"'training.server_tau': 0.0 is out of range; must be > 0.0"),
])
def test_a_server_hyperparameter_the_optimizer_would_ignore_is_refused(overrides, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_config(QUICKSTART, overrides)
    cfg = load_config(QUICKSTART, ["training.server_optimizer=fedyogi", "training.server_b1=0",
                                   "training.server_b2=0.9", "training.server_tau=1e-2"])
    assert (cfg.training.server_b1, cfg.training.server_b2, cfg.training.server_tau) == \
        (0.0, 0.9, 0.01)


def test_unknown_key_in_file(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump({"training": {"rounds": 2, "roundz": 3}}))
    with pytest.raises(ConfigError, match=r"unknown config key 'training.roundz'.*allowed keys"):
        load_config(p)
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")


def test_a_config_file_that_is_not_a_readable_text_mapping_is_named(tmp_path):
    # Before: a bare UnicodeDecodeError / TypeError traceback, or "not found" for a
    # path that exists.
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00a")
    with pytest.raises(ConfigError, match=r"binary.yaml is not UTF-8 text"):
        load_config(binary)
    complex_key = tmp_path / "complex.yaml"
    complex_key.write_text("? [a, b]\n: 1\n")
    with pytest.raises(ConfigError, match=r"complex.yaml: keys must be plain names"):
        load_config(complex_key)
    (tmp_path / "adir.yaml").mkdir()
    with pytest.raises(ConfigError, match=r"adir.yaml is a directory or a device, not a file"):
        load_config(tmp_path / "adir.yaml")


def test_exponent_numbers_without_a_dot_are_numbers_in_files_and_overrides(tmp_path):
    # YAML 1.1 (PyYAML) reads 1e-3 as a string; this failed validation before.
    p = tmp_path / "c.yaml"
    p.write_text("training: {lr: 1e-3}\nmodel: {name: mlp}\n")
    assert load_config(p).training.lr == 0.001
    assert load_config(p, ["training.lr=2E-2"]).training.lr == 0.02
    assert load_config(p, ["training.lr=+5e+1"]).training.lr == 50.0
    # Not a number: still a string, and named as such.
    with pytest.raises(ConfigError, match=r"'training.lr': expected a number, got '1e-3x'"):
        load_config(p, ["training.lr=1e-3x"])
    assert load_config(p, ["name=1e3run"]).name == "1e3run"


def test_cli_bad_value_is_one_line_not_a_traceback(capsys):
    assert main(["run", str(QUICKSTART), "--set", "rounds=abc"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("fedsim: config error: config key 'training.rounds'")
    assert not any("Traceback" in line for line in err)


def test_cli_subprocess_unknown_key_exit_code():
    proc = subprocess.run([sys.executable, "-m", "fedsim", "run", str(QUICKSTART), "--set", "foo=1"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "unknown config key" in proc.stderr


def _run(tmp_path, name):
    out = tmp_path / name
    args = ["run", str(QUICKSTART), "--quiet", "--set", "dataset=synthetic", "--set", "model.name=mlp",
            "--set", "image_size=16", "--set", "num_clients=8", "--set", "clients_per_round=3",
            "--set", "rounds=3", "--set", "eval.every=1", "--set", "lr=0.5",
            "--set", "optimizer=sgd", "--set", f"output.dir={out}"]
    assert main(args) == 0
    return out


def test_run_writes_files_and_is_deterministic(tmp_path):
    a, b = _run(tmp_path, "a"), _run(tmp_path, "b")
    for f in ("config.yaml", "metrics.jsonl", "summary.json", "learning_curve.png"):
        assert (a / f).exists(), f
    rows = [json.loads(l) for l in (a / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [0, 1, 2]
    assert all("train_loss" in r and "test_accuracy" in r and "seconds" in r for r in rows)
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (a, b))
    for k in ("test_accuracy", "rounds", "num_clients", "seconds"):
        assert k in sa
    from fedsim.provenance import environment
    assert sa["environment"] == environment()  # the code, JAX, device, convolution rule
    timing = {"seconds", "peak_rss_mb"}
    assert {k: v for k, v in sa.items() if k not in timing} == \
           {k: v for k, v in sb.items() if k not in timing}
    ra = [{k: v for k, v in r.items() if k != "seconds"} for r in rows]
    rb = [{k: v for k, v in json.loads(l).items() if k != "seconds"}
          for l in (b / "metrics.jsonl").read_text().splitlines()]
    assert ra == rb


def test_report_command(tmp_path, capsys):
    a = _run(tmp_path, "a")
    capsys.readouterr()
    assert main(["report", str(a)]) == 0
    out = capsys.readouterr().out
    assert "test_accuracy" in out and "round" in out
    assert main(["report", str(tmp_path / "missing")]) == 1
    assert "or a sweep's directory?" in capsys.readouterr().err
    sweep = tmp_path / "sweep"  # a sweep's directory: its table
    sweep.mkdir()
    (sweep / "results.md").write_text("| cell | status |\n|---|---|\n| seed=0 | done |\n")
    assert main(["report", str(sweep)]) == 0
    assert capsys.readouterr().out == (sweep / "results.md").read_text()


def test_report_shows_what_a_defense_logged_each_round(tmp_path, capsys):
    """epsilon (DP), priprune_rate (PriPrune), ...: a column each, blank where absent."""
    (tmp_path / "summary.json").write_text('{"test_accuracy": 0.5}')
    (tmp_path / "metrics.jsonl").write_text(
        '{"round": 0, "train_loss": 1.0, "seconds": 1.0, "dp_mechanism": "gaussian", '
        '"epsilon": 0.25, "clients": 3}\n'
        '{"round": 1, "train_loss": 0.5, "seconds": 1.0, "epsilon": 0.5, '
        '"priprune_rate": 0.0375, "test_accuracy": 0.75}\n')
    assert main(["report", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.split()[:1] == ["round"])
    assert lines[head].split() == ["round", "train_loss", "test_acc", "seconds", "epsilon",
                                   "priprune_rate"]
    assert lines[head + 1].split() == ["0", "1.0000", "1.00", "0.25"]
    assert lines[head + 2].split() == ["1", "0.5000", "0.7500", "1.00", "0.5", "0.0375"]


def test_metrics_files_are_read_strictly_but_a_torn_last_line_is_forgiven(tmp_path, capsys):
    from fedsim.results import RunFileError, read_metrics

    path = tmp_path / "metrics.jsonl"
    good = '{"round": 0, "train_loss": 1.0}\n{"round": 1, "train_loss": 0.5}\n'
    path.write_text(good + '{"round": 2, "train_lo')  # killed mid-append
    assert [r["round"] for r in read_metrics(path)] == [0, 1]
    # A torn line in the middle used to drop every row after it without a word.
    path.write_text('{"round": 0, "train_loss": 1.0}\n{"round": 1, "tr\n'
                    '{"round": 2, "train_loss": 0.5}\n')
    with pytest.raises(RunFileError, match=r"metrics.jsonl, line 2: not JSON"):
        read_metrics(path)
    # JSON that is not a round's row ended in an AttributeError in `fedsim report`.
    # A train_loss that is not a number (or null) ended in a TypeError there.
    for line in ("[1, 2]", '{"train_loss": 1.0}', '{"round": "0", "train_loss": 1.0}',
                 '{"round": 2}', '{"round": 2, "train_loss": {"a": 1}}',
                 '{"round": 2, "train_loss": true}'):
        path.write_text(good + line + "\n")
        with pytest.raises(RunFileError, match=r"line 3: expected a round's row"):
            read_metrics(path)
    path.write_text(good + '{"round": 2, "train_loss": null}\n')
    assert read_metrics(path)[2]["train_loss"] is None  # a round every client skipped
    # Not text, or not a file: a bare UnicodeDecodeError / IsADirectoryError before.
    path.write_bytes(b"\xff\xfe\n")
    with pytest.raises(RunFileError, match=r"metrics.jsonl: not readable as text"):
        read_metrics(path)
    path.unlink()
    path.mkdir()
    with pytest.raises(RunFileError, match=r"metrics.jsonl: not readable as text"):
        read_metrics(path)
    path.rmdir()
    (tmp_path / "summary.json").write_text('{"test_accuracy": 0.5}')
    path.write_text("[1, 2]\n")
    for command in (["report", str(tmp_path)], ["compare", str(tmp_path)]):
        assert main(command) == 1
        assert capsys.readouterr().err.startswith(f"fedsim: error: {path}, line 1: expected")


@pytest.mark.parametrize("name,text,named", [
    ("summary.json", '{"test_accuracy": 0.5', "summary.json: not readable as JSON"),
    ("summary.json", "[1]", "summary.json: expected a JSON object, got list"),
    ("attack_summary.json", '{"victims": [1', "attack_summary.json: not readable as JSON"),
    ("attack_summary.json", '{"victims": [1]}', "attack_summary.json: expected 'victims' to be"),
])
def test_report_names_a_run_file_that_is_not_what_fedsim_wrote(tmp_path, capsys, name, text, named):
    # Each of these once ended in a JSONDecodeError, AttributeError or KeyError.
    (tmp_path / "metrics.jsonl").write_text('{"round": 0, "train_loss": 1.0}\n')
    (tmp_path / "summary.json").write_text('{"test_accuracy": 0.5}')
    (tmp_path / name).write_text(text)
    assert main(["report", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"fedsim: error: {tmp_path / name}") and named in err, err


def test_report_shows_missing_attack_metrics_as_nan(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text('{"round": 0, "train_loss": 1.0}\n')
    (tmp_path / "summary.json").write_text('{"test_accuracy": 0.5}')
    (tmp_path / "attack_summary.json").write_text('{"victims": [{"client": 3, "psnr": 20.5}]}')
    assert main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-2].split() == ["3", "?", "20.50", "nan", "nan", "nan", "nan"]
    assert out[-1].split() == ["mean", "nan", "nan", "nan", "nan", "nan"]


def test_privacy_command_is_available_through_fedsim(capsys):
    code = main(["privacy", "vmf", "--kappa", "75", "--dim", "13700", "--sample-rate",
                 str(128 / 60000), "--compositions", "3", "--delta", str(1 / 60000), "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert abs(out["epsilon"] - 0.49) / 0.49 < 0.05 and out["approach"] == "1"


@pytest.mark.parametrize("override,key", [("training.optimizer=adam", "training.optimizer"),
                                          ("training.weight_decay=0.1", "training.weight_decay")])
def test_fedsgd_refuses_a_client_optimizer_it_would_ignore(override, key):
    """FedSGD clients send one plain gradient step: a client optimizer or weight
    decay changed nothing (same parameters as plain SGD) and must be refused."""
    with pytest.raises(ConfigError, match=rf"'{key}'.*FedSGD.*server_optimizer"):
        load_config(None, ["training.algorithm=fedsgd", override])
    load_config(None, ["training.algorithm=fedavg", override])


def test_fedsgd_refuses_local_epochs_it_would_ignore():
    # Before: accepted; the client took one step whatever local_epochs said.
    with pytest.raises(ConfigError, match=r"'training.local_epochs': 5 applies to FedAvg's "
                                          r"local training; a FedSGD client sends one"):
        load_config(None, ["training.algorithm=fedsgd", "training.local_epochs=5"])
    assert load_config(None, ["training.algorithm=fedavg", "training.local_epochs=5"])


def test_a_key_given_twice_is_refused_and_a_quoted_number_stays_a_string(tmp_path):
    """PyYAML keeps the last of two equal keys silently (the first ``training``
    section, and its lr, was lost); and a dump/reload turned ``"1e5"`` into a float."""
    dup = tmp_path / "dup.yaml"
    dup.write_text("training: {lr: 0.5, rounds: 3}\ntraining: {rounds: 7}\n")
    with pytest.raises(ConfigError, match=r"dup.yaml.*key 'training' is given twice"):
        load_config(str(dup), [])
    quoted = tmp_path / "quoted.yaml"
    quoted.write_text('name: "1e5"\n')
    assert load_config(str(quoted), []).name == "1e5"
    assert load_config(str(quoted), ["training.lr=1e-3"]).training.lr == 1e-3


def test_run_of_an_attack_config_says_the_attack_is_not_run(tmp_path, capsys):
    """`fedsim run` trains and does not attack: it says so, and compare calls the
    run 'attack pending', not 'unfinished' (its training did finish)."""
    cfg = yaml.safe_load(QUICKSTART.read_text())
    cfg["observer"] = {"clients": [0], "rounds": [0]}
    cfg["attack"] = {"name": "inverting_gradients", "grants": {"batch_size": True}}
    path = tmp_path / "attack.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "run"
    args = ["run", str(path), "--quiet", "--set", "dataset=synthetic", "--set", "model.name=mlp",
            "--set", "image_size=16", "--set", "num_clients=8", "--set", "clients_per_round=3",
            "--set", "rounds=1", "--set", "eval.every=1", "--set", "optimizer=sgd",
            "--set", f"output.dir={out}"]
    capsys.readouterr()
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "has an `attack` section, which `fedsim run` does not run" in err
    from fedsim.compare import load_run, table_row
    assert (out / "summary.json").exists() and not (out / "attack_summary.json").exists()
    assert table_row("run", load_run(out))["status"] == "attack pending"
    # a plain config gets no note
    assert main(args[:1] + [str(QUICKSTART)] + args[2:-1] + [f"output.dir={tmp_path / 'plain'}"]) == 0
    assert "`attack` section" not in capsys.readouterr().err


def test_a_count_beyond_32_bits_is_refused_by_key():
    # Before: accepted, then an OverflowError in round 0 naming no key.
    for key in ("training.local_epochs", "data.classes_per_client", "pruning.synflow_iterations"):
        with pytest.raises(ConfigError, match=rf"'{key}': 3000000000 is out of range; must be "
                                              r"<= 2147483647"):
            load_config(None, [f"{key}=3000000000"])
    assert load_config(None, ["seed=4294967295"]).seed == 2**32 - 1  # its own bound


def test_setting_a_whole_section_says_it_is_a_section():
    # Before: "--set training: unknown config key", though training is one.
    with pytest.raises(ConfigError, match=r"--set training: training is a section; set one of "
                                          r"its keys, e\.g\. --set training\.algorithm=\.\.\."):
        load_config(None, ["training={rounds: 1}"])
