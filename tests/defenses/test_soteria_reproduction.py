"""The equal-accuracy acceptance rule of benchmarks/reproduce_sun2021.py."""

from benchmarks.reproduce_sun2021 import acceptance


def _row(defense, param, acc, mse, attack="dlg"):
    return {"attack": attack, "defense": defense, "param": param, "accuracy": acc, "mse": mse}


def test_acceptance_uses_only_settings_within_tolerance():
    rows = [_row("none", 0, 0.60, 0.001),
            _row("soteria", 0.2, 0.595, 0.3), _row("soteria", 0.4, 0.55, 0.9),  # 0.4 too costly
            _row("gc", 0.1, 0.60, 0.01), _row("gc", 0.5, 0.40, 0.5),
            _row("dp_gaussian", 1e-4, 0.61, 0.02), _row("dp_laplace", 1e-4, 0.59, 0.03)]
    out = acceptance(rows, "dlg")
    assert out["best"]["soteria"]["param"] == 0.2 and out["best"]["gc"]["param"] == 0.1
    assert abs(out["ratios"]["gc"] - 30.0) < 1e-9 and abs(out["ratios"]["dp_laplace"] - 10) < 1e-9
    assert out["verdict"] == "PASS"
    rows[-1]["mse"] = 0.031  # ratio 9.7 < 10 against DP-Laplace
    assert acceptance(rows, "dlg")["verdict"] == "FAIL"


def test_acceptance_vacuous_or_unmeasured():
    assert acceptance([_row("none", 0, None, 0.1)], "dlg") is None
    rows = [_row("none", 0, 0.10, 0.1), _row("soteria", 0.4, 0.10, 0.2)]
    assert acceptance(rows, "dlg")["verdict"].startswith("VACUOUS")
    rows = [_row("none", 0, 0.6, 0.1), _row("soteria", 0.4, 0.5, 0.2), _row("gc", 0.1, 0.6, 0.1)]
    assert acceptance(rows, "dlg")["verdict"].startswith("FAIL")
