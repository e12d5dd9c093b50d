"""The ``privacy`` CLI: JSON output and one-line errors with exit code 2."""

import json
import subprocess
import sys

import pytest

from defenses.accounting import cli


def test_vmf_json(capsys):
    rc = cli.main(["privacy", "vmf", "--kappa", "75", "--dim", "13700", "--sample-rate",
                   str(128 / 60000), "--compositions", "3", "--delta", str(1 / 60000), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert out["approach"] == "1" and abs(out["epsilon"] - 0.49) / 0.49 < 0.05
    assert {"epsilon", "delta", "approach", "alpha", "convention"} <= set(out)


def test_gaussian_and_capacity(capsys):
    assert cli.main(["privacy", "gaussian", "--sigma", "1.1", "--sample-rate", "0.01",
                     "--steps", "100", "--delta", "1e-5"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["convention"] == "per-step" and out["epsilon"] > 0
    assert cli.main(["privacy", "capacity", "vmf", "--kappa", "75", "--dim", "13700"]) == 0
    assert float(capsys.readouterr().out) > 0
    assert cli.main(["privacy", "capacity", "gaussian", "--sigma", "1", "--radius", "1",
                     "--dim", "10", "--json"]) == 0
    assert "log_bayes_capacity" in json.loads(capsys.readouterr().out)


def test_dp_fedavg_is_the_accountant_a_run_reports(capsys):
    from defenses.accounting import dp_fedavg_epsilon
    assert cli.main(["privacy", "dp-fedavg", "--sigma", "1.0", "--clients-per-round", "100",
                     "--num-clients", "10000", "--rounds", "1000", "--certain-rounds", "2",
                     "--delta", "1e-5"]) == 0
    out = json.loads(capsys.readouterr().out)
    expected = dp_fedavg_epsilon(1.0, 0.01, 1e-5, sampled_rounds=998, certain_rounds=2)
    assert out["epsilon"] == expected.epsilon and out["count"] == 1000
    assert out["mechanism"] == "dp_fedavg" and out["sample_rate"] == 0.01


_FEDAVG = ["dp-fedavg", "--sigma", "1", "--clients-per-round", "2", "--num-clients", "10"]


@pytest.mark.parametrize("argv,name", [
    ([*_FEDAVG, "--rounds", "3", "--delta", "2"], "--delta"),
    ([*_FEDAVG, "--rounds", "0", "--delta", "1e-5"], "--rounds"),
    ([*_FEDAVG, "--rounds", "3", "--certain-rounds", "4", "--delta", "1e-5"], "--certain-rounds"),
    ([*_FEDAVG, "--rounds", "3", "--certain-rounds", "1.5", "--delta", "1e-5"], "--certain-rounds"),
    ([*_FEDAVG, "--rounds", "3", "--certain-rounds", "-1", "--delta", "1e-5"], "integer >= 0"),
    ([*_FEDAVG, "--rounds", "3", "--certain-rounds", "nan", "--delta", "1e-5"], "integer >= 0"),
    (["dp-fedavg", "--sigma", "1", "--clients-per-round", "20", "--num-clients", "10",
      "--rounds", "3", "--delta", "1e-5"], "--clients-per-round"),
    (["gaussian", "--sigma", "0", "--sample-rate", "0.1", "--steps", "3", "--delta", "1e-5"], "--sigma"),
    (["vmf", "--kappa", "-1", "--dim", "10", "--sample-rate", "0.1", "--steps", "3", "--delta", "1e-5"], "--kappa"),
    (["vmf", "--kappa", "1", "--dim", "1", "--sample-rate", "0.1", "--steps", "3", "--delta", "1e-5"], "--dim"),
    (["vmf", "--kappa", "1", "--dim", "10", "--sample-rate", "1.5", "--steps", "3", "--delta", "1e-5"], "--sample-rate"),
    (["vmf", "--kappa", "1", "--dim", "10", "--sample-rate", "0.1", "--steps", "3", "--delta", "1"], "--delta"),
    # Was ignored: a per-step ε printed under "--convention per-epoch".
    (["gaussian", "--sigma", "1", "--sample-rate", "0.01", "--steps", "10", "--convention",
      "per-epoch", "--delta", "1e-5"], "--convention says how --epochs is counted; with --steps"),
    # Was 0 (the log-terms cancelled to rounding noise), exit 0, with a RuntimeWarning.
    (["capacity", "vmf", "--kappa", "1e200", "--dim", "1e200"], "cancel beyond float64"),
    # Was numpy's "Maximum allowed size exceeded", naming no argument.
    (["capacity", "gaussian", "--sigma", "1", "--radius", "1", "--dim", "1e300"],
     "dim must be at most 1e+08"),
])
def test_bad_input_one_line_exit_2(capsys, argv, name):
    assert cli.main(["privacy", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and name in err and "Traceback" not in err


def test_module_entry_point():
    proc = subprocess.run(
        [sys.executable, "-m", "defenses.accounting.cli", "privacy", "gaussian", "--sigma", "-1",
         "--sample-rate", "0.1", "--steps", "3", "--delta", "1e-5"],
        capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "--sigma" in proc.stderr


@pytest.mark.parametrize("argv,named", [
    # dp_accounting's RDP bound is unbounded at a vanishing σ.
    (["gaussian", "--sigma", "1e-300", "--sample-rate", "1", "--steps", "1", "--delta", "1e-5"],
     {"epsilon": "inf", "candidates.rdp": "inf"}),
    # Paper 001's approach 1 is unbounded at a large κ; approach 2 still gives an ε.
    (["vmf", "--kappa", "1e6", "--dim", "10", "--sample-rate", "0.01", "--steps", "10",
      "--delta", "1e-5"], {"candidates.approach_1": "inf"}),
])
def test_an_unbounded_epsilon_is_strict_json_null_and_named(capsys, argv, named):
    # Before, the output held Python's `Infinity`, which strict JSON readers refuse.
    assert cli.main(["privacy", *argv]) == 0
    text = capsys.readouterr().out

    def refuse(constant):
        raise AssertionError(f"non-JSON constant {constant} in {text}")

    out = json.loads(text, parse_constant=refuse)
    assert out["non_finite"] == named
    for path in named:
        node = out
        for part in path.split("."):
            node = node[part]
        assert node is None
    assert all(v is not None and v > 0 for k, v in out["candidates"].items()
               if f"candidates.{k}" not in named)


def test_a_bounded_epsilon_has_no_non_finite_entry(capsys):
    assert cli.main(["privacy", "gaussian", "--sigma", "1.1", "--sample-rate", "0.01",
                     "--steps", "100", "--delta", "1e-5"]) == 0
    assert "non_finite" not in json.loads(capsys.readouterr().out)


def test_running_out_of_memory_is_one_line_naming_the_accountant(capsys, monkeypatch):
    def pld(*args, **kwargs):
        raise MemoryError("Unable to allocate 38.0 GiB")

    monkeypatch.setattr(cli, "gaussian_epsilon", pld)
    assert cli.main(["privacy", "gaussian", "--sigma", "1e-3", "--sample-rate", "0.1",
                     "--steps", "10", "--delta", "1e-5", "--accountant", "pld"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "out of memory" in err and "38.0 GiB" in err
    assert "try --accountant rdp" in err


@pytest.mark.parametrize("sigma", ["1e-300", "1e300"])
def test_arithmetic_that_fails_far_outside_any_use_is_one_line_exit_1(capsys, sigma):
    # Before: a ZeroDivisionError / OverflowError traceback from dp_accounting.
    argv = ["privacy", "gaussian", "--sigma", sigma, "--sample-rate", "0.01", "--steps", "100",
            "--delta", "1e-5"]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    assert err.startswith("error: the gaussian accountant's arithmetic failed at these settings")


def test_the_vmf_capacitys_precision_check_refuses_only_what_float64_cannot_hold():
    import math

    from defenses.bounds import log_bayes_capacity_vmf

    # Large but representable (the sum's rounding far below 1e-6 of it): not refused.
    # Its value is tested against mpmath in test_accounting_bessel.py up to κ = 1e20.
    big = log_bayes_capacity_vmf(1e154, 1e154)
    assert math.isfinite(big) and big > 1e150
    with pytest.raises(ValueError, match="cancel beyond float64's precision"):
        log_bayes_capacity_vmf(1e200, 1e200)
