"""fedsim report: a learning curve it cannot write is a warning, not the report's end."""

import pytest

from fedsim.cli import main


def _run(d):
    (d / "metrics.jsonl").write_text('{"round": 0, "train_loss": 1.0, "test_accuracy": 0.5}\n'
                                     '{"round": 1, "train_loss": 0.5, "test_accuracy": 0.75}\n')
    (d / "summary.json").write_text('{"test_accuracy": 0.75}')
    return d


@pytest.mark.parametrize("blocked", ["directory", "permission"])
def test_a_learning_curve_that_cannot_be_written_is_a_one_line_warning(
        tmp_path, capsys, monkeypatch, blocked):
    # A directory in the way, or a read-only run directory / another user's run
    # (simulated: the tests may run as root), ended the report in a traceback.
    run = _run(tmp_path)
    plot = run / "learning_curve.png"
    if blocked == "directory":
        plot.mkdir()
    else:
        import matplotlib.figure

        def refuse(self, path, *args, **kwargs):
            raise PermissionError(13, "Permission denied", str(path))

        monkeypatch.setattr(matplotlib.figure.Figure, "savefig", refuse)
    assert main(["report", str(run)]) == 0
    captured = capsys.readouterr()
    assert '"test_accuracy": 0.75' in captured.out  # the report itself
    assert captured.out.splitlines()[-1].split() == ["1", "0.5000", "0.7500", "0.00"]
    why = "IsADirectoryError: Is a directory" if blocked == "directory" else \
        "PermissionError: Permission denied"
    assert captured.err == f"fedsim: warning: {plot} not written ({why})\n"



def test_the_privacy_columns_a_run_carries_become_labelled_series_with_gaps_at_null():
    import math

    from fedsim.results import privacy_series

    rows = [{"round": 0, "train_loss": 1.0, "epsilon": 0.5, "delta": 0.01,
             "client_level_epsilon": None, "client_level_delta": 0.1, "leakage_total": 3.0},
            {"round": 1, "train_loss": 0.9, "epsilon": 0.8, "delta": 0.01,
             "client_level_epsilon": 1.5, "client_level_delta": 0.1, "leakage_total": 6.0}]
    series = privacy_series(rows)
    assert list(series) == ["record-level ε, δ = 0.01", "user-level ε (DP-FedAvg), δ = 0.1",
                            "leakage bound n·κ (worst client)"]
    assert series["record-level ε, δ = 0.01"] == ([0, 1], [0.5, 0.8])
    rounds, user = series["user-level ε (DP-FedAvg), δ = 0.1"]
    assert rounds == [0, 1] and math.isnan(user[0]) and user[1] == 1.5
    assert privacy_series([{"round": 0, "train_loss": 1.0}]) == {}
    # A hand-edited file's string is a gap, not a crash of `fedsim report`.
    odd = privacy_series([{"round": 0, "train_loss": 1.0, "epsilon": "n/a", "delta": "x"}])
    (rounds, values), = odd.values()
    assert list(odd) == ["record-level ε"] and math.isnan(values[0])


def test_a_learning_curve_draws_the_privacy_spent_below_where_the_rows_carry_it(tmp_path):
    import matplotlib.image

    from fedsim.results import plot_learning_curve

    rows = [{"round": r, "train_loss": 1.0 / (r + 1), "test_accuracy": 0.5,
             "epsilon": 0.3 * (r + 1), "delta": 1e-3} for r in range(3)]
    plot_learning_curve([{k: row[k] for k in ("round", "train_loss", "test_accuracy")}
                         for row in rows], tmp_path / "plain.png")
    plot_learning_curve(rows, tmp_path / "private.png")
    # 6 × 4 in at 100 dpi; with the privacy panel 6 × 6.5 in.
    assert matplotlib.image.imread(tmp_path / "plain.png").shape[:2] == (400, 600)
    assert matplotlib.image.imread(tmp_path / "private.png").shape[:2] == (650, 600)
    # Only the channels' leakage bound (no ε): the panel too, on one axis.
    plot_learning_curve([{"round": 0, "train_loss": 1.0, "leakage_total": 2.0}],
                        tmp_path / "leakage.png")
    assert matplotlib.image.imread(tmp_path / "leakage.png").shape[:2] == (650, 600)
