"""The summary numbers users read: compare's table, the sweep's over-seed
statistics and the privacy plot's series labels.

Each test checks them against the rule the docstrings state, computed here by
hand or with numpy/statistics, on run files written by the test (no simulation).
"""

import json
import math
from pathlib import Path

import numpy as np

from fedsim.compare import compare, load_run, table_row
from fedsim.results import privacy_series
from fedsim.sweep import over_seeds


def _write_run(d: Path, rows, summary=None) -> Path:
    d.mkdir(parents=True)
    # json.dumps writes NaN as NaN, which json.loads (and read_metrics) read back.
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if summary is not None:
        (d / "summary.json").write_text(json.dumps(summary))
    return d


def test_a_nan_accuracy_or_duration_is_left_out_of_the_table(tmp_path):
    """Kills ``evals = [r for r in rows if r.get("test_accuracy") is not None]``
    and ``sum(r.get("seconds") or 0 ...)`` in ``compare.table_row``.

    Reference: ``fedsim.results.finite_number``: a NaN in a run file is left out
    of what a table averages, sums or ranks. Accuracies 0.4, 0.7, NaN: the last
    evaluated accuracy is 0.7 (round 1), the best 0.7 (round 1); the unfinished
    run's seconds are 0.5 + 0.25 (the NaN row's left out).
    """
    rows = [{"round": 0, "train_loss": 2.0, "test_accuracy": 0.4, "seconds": 0.5},
            {"round": 1, "train_loss": 1.5, "test_accuracy": 0.7, "seconds": 0.25},
            {"round": 2, "train_loss": 1.2, "test_accuracy": float("nan"), "seconds": float("nan")}]
    run = _write_run(tmp_path / "r", rows)
    row = table_row("r", load_run(run))
    assert row["test_accuracy"] == 0.7 and row["best_test_accuracy"] == 0.7
    assert row["best_round"] == 1
    assert row["seconds"] == 0.75 and row["final_train_loss"] == 1.2
    assert "| 0.7 | 0.7 | 1 | 1.2 | 0.75 |" in compare([run])


def test_cells_skipped_as_done_count_in_the_over_seed_statistics():
    """Kills ``done = [m for m in members if m["status"] == "done"]`` in ``over_seeds``.

    Reference: the ``over_seeds`` docstring: mean, sample standard deviation and
    count over the setting's *finished* cells; a cell finished earlier and
    skipped on a rerun (status ``done (skipped)``) is finished. Computed here
    with numpy (ddof = 1).
    """
    acc = {0: 0.5, 1: 0.6, 2: 0.8}
    rows = [{"cell": f"seed={s}", "seed": s, "status": st, "test_accuracy": acc[s]}
            for s, st in ((0, "done (skipped)"), (1, "done"), (2, "done (skipped)"))]
    rows.append({"cell": "seed=3", "seed": 3, "status": "failed: FloatingPointError: x"})
    (entry,) = over_seeds(["seed"], rows)
    assert entry["cells"] == 4 and entry["done"] == 3
    values = np.array(list(acc.values()))
    assert entry["test_accuracy"]["n"] == 3
    np.testing.assert_allclose(entry["test_accuracy"]["mean"], values.mean(), rtol=1e-12)
    np.testing.assert_allclose(entry["test_accuracy"]["std"], values.std(ddof=1), rtol=1e-12)


def test_an_epsilon_series_is_labelled_with_its_last_delta():
    """Kills ``deltas[0]`` in ``privacy_series`` (the first δ named).

    Reference: the ``privacy_series`` docstring: each ε series is labelled with
    its *last* δ (a δ chosen again on resume holds from then on).
    """
    rows = [{"round": 0, "train_loss": 1.0, "epsilon": 0.5, "delta": 1e-5},
            {"round": 1, "train_loss": 0.9, "epsilon": 0.9, "delta": 2e-5},
            {"round": 2, "train_loss": 0.8, "epsilon": None, "delta": None}]
    series = privacy_series(rows)
    assert list(series) == ["record-level ε, δ = 2e-05"]
    rounds, values = series["record-level ε, δ = 2e-05"]
    assert rounds == [0, 1, 2] and values[:2] == [0.5, 0.9] and math.isnan(values[2])


def test_a_resumed_metrics_log_keeps_only_the_rounds_before_the_checkpoint(tmp_path):
    """Kills ``r.get("round", 0) <= keep_rounds_below`` in ``MetricsLog``.

    Reference: the ``MetricsLog`` docstring (keep the file's rows of *earlier*
    rounds) and ``fedsim.run``: a checkpoint after r rounds has done rounds
    0 … r−1, so resuming reruns round r and appends its row again. Rows of round
    r and later, written after that checkpoint (``checkpoint_every`` > 1, or a
    kill between the row and the checkpoint), must go, else round r is in the
    file twice and ``fedsim compare`` counts one round more.
    """
    from fedsim.results import MetricsLog, read_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"round": r, "train_loss": 1.0 / (r + 1)}) + "\n"
                            for r in range(5)))
    log = MetricsLog(path, keep_rounds_below=3)
    assert [r["round"] for r in log.rows] == [0, 1, 2]
    for r in (3, 4):
        log.append({"round": r, "train_loss": 0.0})
    assert [r["round"] for r in read_metrics(path)] == [0, 1, 2, 3, 4]
    assert table_row("run", load_run(tmp_path))["rounds"] == 5


def test_over_seeds_has_one_entry_per_setting_of_every_other_key():
    """Kills ``json.dumps([r[k] for k in others[:1]])`` (cells grouped by the first other key only).

    Reference: the ``over_seeds`` docstring: one entry per setting of the grid's
    *other* keys. A 2 × 2 grid over ``a`` and ``b`` with two seeds has four
    settings, each the mean of its own two cells (computed here by hand).
    """
    rows = [{"cell": f"{s}{a}{b}", "seed": s, "a": a, "b": b, "status": "done",
             "test_accuracy": 0.1 * s + a + 10 * b}
            for a in (0, 1) for b in (0, 1) for s in (0, 1)]
    entries = over_seeds(["seed", "a", "b"], rows)
    assert [(e["a"], e["b"], e["cells"]) for e in entries] == [(0, 0, 2), (0, 1, 2), (1, 0, 2),
                                                              (1, 1, 2)]
    for e in entries:
        np.testing.assert_allclose(e["test_accuracy"]["mean"], 0.05 + e["a"] + 10 * e["b"],
                                   rtol=1e-12)
        assert e["test_accuracy"]["n"] == 2


def test_the_final_train_loss_of_a_run_without_evaluations_is_its_last_rows(tmp_path):
    """Kills ``"final_train_loss": rows[-1].get("train_loss") if evals else None``.

    Reference: the ``table_row`` docstring: None only where the run has no value;
    a run not yet evaluated (``eval.every`` beyond its rounds) has trained, and
    its last row's train loss is its final train loss.
    """
    run = _write_run(tmp_path / "r", [{"round": 0, "train_loss": 2.0},
                                      {"round": 1, "train_loss": 1.25}])
    row = table_row("r", load_run(run))
    assert row["final_train_loss"] == 1.25 and row["test_accuracy"] is None
