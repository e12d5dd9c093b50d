"""benchmarks/diagnose_gs_accuracy_chaos.py: settings read from a results JSON, the
per-run summary, and the markdown (the training itself is what the script measures)."""

import jax
import jax.numpy as jnp
import pytest

from benchmarks import diagnose_gs_accuracy_chaos as chaos

GS_SETTINGS = {"seed": 0, "dataset": "fashion_mnist", "image_size": 16, "train_lr_gs": 0.05,
               "rounds_gs": 30, "gs_clients_per_round": 5, "gs_max_test": 2000, "gs_width": 8,
               "acc_last": 5, "seeds": 3, "train_target": "gradient", "dp_sigma": "variance",
               "lr": 0.01}


def test_settings_come_from_the_results_json_and_missing_ones_are_named():
    a = chaos.gs_settings({"parts_run": {"gs": {"settings": dict(GS_SETTINGS, extra=1)}}})
    assert a.train_lr_gs == 0.05 and a.rounds_gs == 30 and not hasattr(a, "extra")
    with pytest.raises(SystemExit, match="no GS part settings"):
        chaos.gs_settings({"parts_run": {"dlg": {}}})
    partial = {k: v for k, v in GS_SETTINGS.items() if k != "gs_max_test"}
    with pytest.raises(SystemExit, match="gs_max_test"):
        chaos.gs_settings({"parts_run": {"gs": {"settings": partial}}})


def test_committed_accuracies_pick_the_attack_and_setting():
    rows = [{"attack": "dlg", "defense": "none", "param": 0.0, "accuracy_seeds": [0.6]},
            {"attack": "gs", "defense": "none", "param": 0.0, "accuracy_seeds": [0.2]},
            {"attack": "gs", "defense": "gc", "param": 0.01, "accuracy_seeds": [0.1]}]
    assert chaos.committed_accuracies({"rows": rows}, "gs", "none", 0.0) == [0.2]
    assert chaos.committed_accuracies({"rows": rows}, "dlg", "none", 0.0) == [0.6]
    with pytest.raises(SystemExit, match="no gs row gc 0.5"):
        chaos.committed_accuracies({"rows": rows}, "gs", "gc", 0.5)


def test_summary_reads_the_last_rounds_and_the_round_that_leaves_chance():
    acc = [0.1, 0.1, 0.16, 0.1, 0.3, 0.4]
    s = chaos.summarise({"accuracy": acc}, acc_last=2)
    assert s["last_rounds_mean"] == pytest.approx(0.35)
    assert s["left_chance_round"] == 3  # 1-based: the third round's 0.16 > 0.15
    assert chaos.summarise({"accuracy": [0.1] * 4}, acc_last=2)["left_chance_round"] is None


def test_max_param_difference_is_over_every_leaf():
    a = {"w": jnp.zeros((2, 2)), "b": jnp.zeros(3)}
    b = {"w": jnp.zeros((2, 2)), "b": jnp.array([0.0, -0.5, 0.25])}
    assert chaos.max_param_difference(a, b) == 0.5
    assert chaos.max_param_difference(a, a) == 0.0


def test_markdown_reports_every_run_and_both_rebuild_checks():
    curves = [[0.1, 0.2, 0.3], [0.1, 0.1, 0.1]]
    run = {"summary": [{"last_rounds_mean": 0.25, "left_chance_round": 2},
                       {"last_rounds_mean": 0.1, "left_chance_round": None}],
           "curves": curves, "max_param_difference": [[0.0, 1e-8, 0.1], [0.0, 0.0, 0.0]],
           "paired_difference": {"per_seed": [0.0, 0.0], "mean": 0.0, "se": 0.0}}
    res = {"command": "benchmarks/diagnose_gs_accuracy_chaos.py", "commit": "a" * 40,
           "results_file": "sun2021.json", "results_commit": "b" * 7, "seconds": 1.0,
           "settings": dict(GS_SETTINGS, acc_last=2), "fl_seeds": [0, 1],
           "gc_share": {"relative_change": 0.0, "zero_share_before": 0.1,
                        "zero_share_after": 0.1},
           "rebuild_check": {"ours": [0.25, 0.1], "committed": [0.3, 0.1], "equal": False},
           "dlg_control": {"fl_seed": 0, "ours": 0.6, "committed": 0.6, "equal": True,
                           "results_commit": "c" * 7, "seconds": 2.0},
           "runs": {name: run for name in chaos.RUNS}}
    md = chaos.markdown(res)
    for name in chaos.RUNS:
        assert f"| {name} |" in md
    assert "**different**" in md and "**equal**" in md
    assert "0.10 0.20 0.30" in md


def test_gc_share_is_zero_where_only_zeros_are_pruned():
    """GC at a rate below the zero share of the gradient prunes only exact zeros."""
    from types import SimpleNamespace

    def apply_fn(p, x):
        return jax.nn.relu(x.reshape(x.shape[0], -1) @ p["w"]) @ p["v"]

    params = {"w": jnp.concatenate([jnp.ones((4, 2)), -jnp.ones((4, 2))], 1),
              "v": jnp.arange(12.0).reshape(4, 3) / 10}
    data = SimpleNamespace(x=jnp.ones((2, 2, 2, 1)), y=jnp.array([0, 1]), mask=jnp.ones(2))
    sim = SimpleNamespace(apply_fn=apply_fn, client_data=lambda cid: data)
    # Hidden units 2-3 are dead for these inputs: w[:, 2:] and v[2:] (14 of 28 values)
    # get an exactly zero gradient.
    low = chaos.gc_share(sim, params, 0.1)
    assert low["zero_share_before"] == 0.5
    assert low["relative_change"] == 0.0 and low["zero_share_after"] == 0.5
    high = chaos.gc_share(sim, params, 0.9)
    assert high["relative_change"] > 0 and high["zero_share_after"] > high["zero_share_before"]
