"""Helpers of benchmarks/reproduce_tan2024.py: the traced IG run and the paired-ratio summary."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attacks.api import observation_from_gradient
from attacks.inverting_gradients import run_many
from benchmarks import reproduce_tan2024 as R
from fedsim.client import masked_mean_loss
from fedsim.models import build_model, init_params, make_apply_fn

SHAPE = (16, 16, 1)


@pytest.fixture(scope="module")
def victims():
    m = build_model("mlp")
    f, p = make_apply_fn(m), init_params(m, SHAPE, jax.random.key(0))
    rng = np.random.default_rng(0)
    obs, xs = [], []
    for i in range(3):
        x = jnp.asarray(rng.random((1, *SHAPE)), jnp.float32)
        g = jax.grad(masked_mean_loss, argnums=1)(f, p, x, jnp.asarray([i], jnp.int32), jnp.ones(1))
        obs.append(observation_from_gradient(g, p, f, input_shape=SHAPE, num_classes=10, lr=1.0,
                                             batch_size=1))
        xs.append(np.asarray(x))
    return obs, xs


@pytest.mark.parametrize("restarts", [1, 2])
def test_traced_ig_equals_run_many(victims, restarts):
    obs, _ = victims
    cfg = {"iterations": 24, "batch_size": 1, "restarts": restarts, "signed": False}
    key = jax.random.key(3)
    ref = run_many(obs, cfg, key)
    out = R.ig_run_traced(obs, cfg, key, every=8)
    assert out["snapshots"].shape == (3, 3, 1, *SHAPE) and out["loss_trace"].shape == (3, 3)
    np.testing.assert_array_equal(out["steps"], [8, 16, 24])
    for i, r in enumerate(ref):
        np.testing.assert_allclose(out["x"][i], np.asarray(r.x), atol=1e-5)
        np.testing.assert_allclose(out["loss"][i], float(r.loss), rtol=1e-4, atol=1e-7)
    np.testing.assert_array_equal(out["snapshots"][:, -1], out["x"])  # last snapshot = result


def test_traced_ig_rejects_bad_every(victims):
    with pytest.raises(ValueError, match="divide"):
        R.ig_run_traced(victims[0], {"iterations": 10, "batch_size": 1}, jax.random.key(0), every=3)


def test_paired_ratio_summary():
    none = np.array([0.1, 0.2, 0.05, 0.1])
    ch = np.array([0.2, 0.3, 0.1, 0.1])
    s = R.paired_ratio_summary(ch, none, n_boot=2000, seed=1)
    r = ch / none
    assert s["victims"] == 4 and np.allclose(s["per_victim"], r)
    assert np.isclose(s["mean"], r.mean()) and np.isclose(s["ratio_of_means"], ch.mean() / none.mean())
    assert np.isclose(s["geometric_mean"], np.exp(np.log(r).mean()))
    half = 3.182446305284263 * r.std(ddof=1) / 2  # t_{0.975, 3} * s / sqrt(4)
    np.testing.assert_allclose(s["t_interval"], [r.mean() - half, r.mean() + half], rtol=1e-6)
    lo, hi = s["bootstrap_interval"]
    assert lo <= s["ratio_of_means"] <= hi and s["victims_above_1_5"] == 2  # 1.5 itself is not above
    assert R.paired_ratio_summary(ch, none, n_boot=2000, seed=1) == s  # seeded
    with pytest.raises(ValueError):
        R.paired_ratio_summary(ch[:3], none)
    with pytest.raises(ValueError):
        R.paired_ratio_summary([0.1], [0.1])


def test_paper_smallest_fig14_ratio_is_vgg16_natural_300():
    pr = R.paper_fig14_ratios()
    sm = pr["smallest"]
    assert (sm["model"], sm["channel"], sm["kappa"]) == ("VGG16", "natural", 300)
    assert abs(sm["ratio"] - 0.2623 / 0.1955) < 1e-12 and round(sm["ratio"], 2) == 1.34
    assert abs(pr["per_model"]["LeNet"]["natural"]["ratio"] - 0.3337 / 0.1448) < 1e-12


def test_budget_overrides():
    b = R.apply_budget_overrides(R.BUDGETS["quick"], ["ig_models=alexnet", "big_victims=4",
                                                      "big_kappas=50,100,200,300"])
    assert b.ig_models == ("alexnet",) and b.big_victims == 4 and b.big_kappas == (50, 100, 200, 300)
    assert b.ig_victims == R.BUDGETS["quick"].ig_victims
    with pytest.raises(ValueError, match="KEY"):
        R.apply_budget_overrides(b, ["nope=1"])
    with pytest.raises(ValueError, match="big_victims"):
        R.apply_budget_overrides(b, ["big_victims=four"])
    assert R.apply_budget_overrides(b, ["batch_victims_per_call=3"]).batch_victims_per_call == 3


def test_a_negative_attack_split_is_refused_by_name_before_anything_runs(capsys):
    with pytest.raises(SystemExit) as e:
        R.main(["--smoke", "--budget", "batch_victims_per_call=-1"])
    assert e.value.code == 2
    assert "batch_victims_per_call: must be 0" in capsys.readouterr().err


def _ig(model, channel, kappa, mse):
    return {"source": "ig", "model": model, "channel": channel, "kappa": kappa, "ig_mse": mse}


def test_merge_replaces_ig_per_model_and_refreshes_training_rows():
    train = lambda ch, k, auc: {"source": "train", "model": "LeNet", "channel": ch, "kappa": k,
                                "ig_mse": 9.0, "mia_auc": auc, "imp_mia": None if ch == "none" else 0.1}
    old = {"mode": "quick", "rows": [_ig("LeNet", "none", None, 0.05), _ig("LeNet", "natural", 300.0, 0.07),
                                     _ig("AlexNet", "none", None, 0.13), train("none", None, 0.6),
                                     train("natural", 300, 0.55)],
           "ig_settings": {"LeNet": {"victims": 8}, "AlexNet": {"victims": 2}},
           "batch_size_effect": "old", "train_settings": "old", "timing": "old",
           "parts": {"ig:LeNet": {"source": "x"}, "ig:AlexNet": {"source": "x"}, "train": {"source": "x"}}}
    new = {"rows": [_ig("AlexNet", "none", None, 0.11), _ig("AlexNet", "natural", 300.0, 0.2)],
           "ig_settings": {"AlexNet": {"victims": 4}}, "eigenvalues": {}, "batch_size_effect": "new",
           "train_settings": "new", "timing": "new", "parts": {"ig:AlexNet": {"commit": "abc"}}}
    out = R.merge_results(old, new, ("ig",), {"AlexNet"})
    alex = [r for r in out["rows"] if r["model"] == "AlexNet"]
    assert [r["ig_mse"] for r in alex] == [0.11, 0.2]
    assert [r["ig_mse"] for r in out["rows"] if r["source"] == "ig" and r["model"] == "LeNet"] == [0.05, 0.07]
    assert out["ig_settings"] == {"LeNet": {"victims": 8}, "AlexNet": {"victims": 4}}
    assert out["batch_size_effect"] == "old" and out["timing"] == "old"
    assert out["parts"]["ig:AlexNet"] == {"commit": "abc"} and out["parts"]["train"] == {"source": "x"}
    R.refresh_train_ig(out["rows"])
    tr = [r for r in out["rows"] if r["source"] == "train"]
    assert tr[0]["ig_mse"] == 0.05 and tr[1]["ig_mse"] == 0.07
    from defenses.channels import gdc, imp_dra
    assert tr[1]["imp_dra"] == imp_dra(0.07, 0.05) and tr[1]["gdc"] == gdc(0.1, imp_dra(0.07, 0.05))


def test_noisy_input_mse_uses_the_fig14_noise_draw():
    from types import SimpleNamespace

    from defenses.channels import data_statistics

    rng = np.random.default_rng(0)
    x = rng.random((64, 4, 4, 1)).astype(np.float32)
    stats = data_statistics(x)
    ds = SimpleNamespace(x_test=x)
    out = R.noisy_input_mse(ds, stats, 3, [5, 9], [("natural", 1.0), ("white", 2.0)])
    assert set(out) == {"natural|1.0", "white|2.0"}
    ch = R.data_channel("natural", 1.0, stats)
    for vi, i in enumerate([5, 9]):
        xt = np.asarray(ch.apply(jnp.asarray(x[i:i + 1]), (), key=R.victim_noise_key(3, vi))[0])[0]
        assert np.isclose(out["natural|1.0"]["raw"][vi], np.mean((xt - x[i]) ** 2))
        assert np.isclose(out["natural|1.0"]["clipped"][vi], np.mean((np.clip(xt, 0, 1) - x[i]) ** 2))
        assert out["natural|1.0"]["clipped"][vi] <= out["natural|1.0"]["raw"][vi]
    # The runs before Nov 25 2026 ("engine_round"): the same seed's engine round key.
    legacy = R.noisy_input_mse(ds, stats, 3, [5, 9], [("natural", 1.0)], scheme="engine_round")
    key = jax.random.fold_in(jax.random.fold_in(jax.random.key(3), 1), 1)  # engine round 1
    assert np.array_equal(jax.random.key_data(R.victim_noise_key(3, 1, "engine_round")),
                          jax.random.key_data(key))
    xt = np.asarray(R.data_channel("natural", 1.0, stats).apply(
        jnp.asarray(x[9:10]), (), key=key)[0])[0]
    assert np.isclose(legacy["natural|1.0"]["raw"][1], np.mean((xt - x[9]) ** 2))
    assert legacy["natural|1.0"]["raw"] != out["natural|1.0"]["raw"]
    with pytest.raises(ValueError, match="noise key scheme"):
        R.victim_noise_key(3, 1, "split")


def test_victim_noise_keys_are_not_another_runs_keys():
    from tests.key_helpers import assert_fresh, run_keys

    taken = run_keys()
    assert_fresh([R.victim_noise_key(s, v) for s in (0, 3) for v in range(16)], taken,
                 "victim noise keys")
    # what the scheme replaced: victim v's key was the engine's round-v key
    assert jax.random.key_data(R.victim_noise_key(0, 2, "engine_round")).tobytes() in taken


def test_batch_size_experiment_hands_out_fresh_keys(monkeypatch):
    """Model init, every (B, repeat)'s DP key and the attack key are distinct and none
    is another run's key (before: key(seed + 17), and the attack key fold_in(key, 3)
    was also batch size 3's noise parent)."""
    import dataclasses

    from fedsim.data import synthetic_dataset
    from tests.key_helpers import assert_fresh, run_keys

    seen = []
    zeros = lambda params: jax.tree_util.tree_map(jnp.zeros_like, params)  # noqa: E731

    def spy_dp(apply_fn, params, x, y, defense, key):  # only the key matters here
        seen.append(("dp", key))
        return zeros(params)

    def spy_attack(apply_fn, params, grads, restarts, iterations, key, **k):
        seen.append(("attack", key))
        return [np.zeros(k["input_shape"]) for _ in grads], len(grads)

    def spy_init(model, shape, key):
        seen.append(("init", key))
        return init_params(model, shape, key)

    monkeypatch.setattr(R, "dp_victim_gradient", spy_dp)
    monkeypatch.setattr(R, "victim_gradient", lambda apply_fn, params, x, y: zeros(params))
    monkeypatch.setattr(R, "attack", spy_attack)
    monkeypatch.setattr(R, "init_params", spy_init)
    ds = synthetic_dataset(seed=0, image_size=16, num_classes=4, num_train=32, num_test=40)
    # B = 3: where fold_in(key, B) used to be the attack key too
    budget = dataclasses.replace(R.BUDGETS["smoke"], batch_sizes=(3,), batch_repeats=2,
                                 train_models=("lenet",))
    R.batch_size_experiment(ds, budget, 0)
    assert sorted(k for k, _ in seen) == ["attack"] + ["dp"] * 2 + ["init"]
    assert_fresh([k for _, k in seen], run_keys(), "batch-size experiment keys")


def test_training_models_by_part_reads_each_part_off_the_result():
    rows = [{"source": "ig", "model": "LeNet"}, {"source": "fig9", "model": "LeNet-1998"},
            {"source": "train", "model": "LeNet"}, {"source": "train", "model": "LeNet"}]
    result = {"rows": rows, "batch_size_effect": {"settings": {"iterations": 5}},
              "timing": [{"model": "LeNet-1998"}]}
    assert R.training_models_by_part(result) == [
        ("fig9", "LeNet-1998"), ("train", "LeNet"), ("Fig 6 (batch)", "LeNet"),
        ("Table 2 (timing)", "LeNet-1998")]
    result["batch_size_effect"]["settings"]["model"] = "LeNet-1998"
    assert R.training_models_by_part(result)[2] == ("Fig 6 (batch)", "LeNet-1998")
    assert R.training_models_by_part({"rows": [], "timing": []}) == []


def test_every_mode_trains_the_papers_lenet_first():
    # Fig 9, Fig 6 and Table 2 use train_models[0]: the paper's LeNet [33].
    assert all(b.train_models[0] == "lenet5_1998" for b in R.BUDGETS.values())


def _ig_rows(model, none, natural):
    """IG rows of one model: no defense, and every channel at κ 50/300 (natural's values)."""
    rows = [{"source": "ig", "model": model, "channel": "none", "kappa": None, "ig_mse": none}]
    for ch, scale in (("natural", 1.0), ("white", 2.0), ("personalized", 3.0)):
        rows += [{"source": "ig", "model": model, "channel": ch, "kappa": k, "ig_mse": scale * v}
                 for k, v in zip((50.0, 300.0), natural)]
    return rows


def test_acceptance_is_decided_on_the_papers_models_and_extra_victims_are_reported():
    # LeNet-1998 (the paper's LeNet [33]) passes; the ReLU LeNet-5 ("LeNet", not in the
    # paper) fails "≫ no defense" (natural 0.06 < 1.5 × 0.05): reported, scope "extra".
    rows = _ig_rows("LeNet-1998", 0.01, (0.09, 0.02)) + _ig_rows("LeNet", 0.05, (0.16, 0.06))
    checks = R.acceptance_checks(rows, [])
    scopes = {k.split(":")[0]: v["scope"] for k, v in checks.items() if ":" in k}  # IG checks
    assert scopes == {"LeNet-1998": "paper", "LeNet": "extra"}
    assert checks["accuracy increases with κ (Natural)"]["scope"] == "paper"
    failed = [k for k, v in checks.items() if not v["pass"]]
    assert len(failed) == 1 and failed[0].startswith("LeNet: every channel ≫ no defense")
    summary = R.check_summary(checks)
    assert summary[0].startswith("the paper's models") and ": 4/4 PASS" in summary[0]
    assert summary[1].startswith("extra victims") and "2/3 PASS; FAIL: LeNet: every" in summary[1]
    # The same failure on the paper's LeNet fails the paper scope.
    bad = R.acceptance_checks(_ig_rows("LeNet-1998", 0.05, (0.16, 0.06)), [])
    assert "3/4 PASS; FAIL: LeNet-1998: every" in R.check_summary(bad)[0]


def test_table2_discards_a_warmup_pass(monkeypatch):
    # Every method runs once untimed after compiling, then `timing_repeats` timed passes.
    import dataclasses
    import types

    from fedsim.data import Dataset

    calls = []

    def counting_jit(f):
        # Counts the calls of each jitted client update (its traces would count
        # only the compile); jitted still, so the test compiles 4 programs rather
        # than running every op of 16 client updates eagerly.
        fn, idx = jax.jit(f), len(calls)
        calls.append(0)

        def wrapped(*args):
            calls[idx] += 1
            return fn(*args)
        return wrapped

    monkeypatch.setattr(R, "jax", types.SimpleNamespace(
        random=jax.random, block_until_ready=jax.block_until_ready, jit=counting_jit))
    rng = np.random.default_rng(0)
    x = rng.random((64, 32, 32, 1)).astype(np.float32)
    y = rng.integers(0, 10, 64).astype(np.int32)
    ds = Dataset("test", x, y, x[:8], y[:8], 10, x.mean((0, 1, 2)), x.std((0, 1, 2)))
    budget = dataclasses.replace(R.BUDGETS["smoke"], timing_examples=64, timing_repeats=2)
    out = R.timing_experiment("lenet5_1998", ds, R.data_statistics(x), budget, 0)
    assert out["warmup_passes"] == 1 and out["repeats"] == 2
    assert calls == [1 + 1 + 2] * 4  # compile call, warm-up, 2 timed passes; 4 methods
    assert all(len(v) == 2 for v in out["all_seconds"].values())


@pytest.mark.slow  # ~40 s idle: Σ_D of 3,072-dimensional inputs and 24 mechanisms
def test_ig_and_batch_parts_run_on_colour_images():
    # `--dataset cifar10` (where tfds can load it): 32×32×3 inputs, the shape and class count
    # come from the dataset, not from Fashion-MNIST's 32×32×1 / 10 classes.
    import dataclasses

    from fedsim.data import synthetic_dataset

    ds = synthetic_dataset(seed=0, image_size=32, channels=3, num_classes=7, num_train=64, num_test=40)
    stats = R.data_statistics(ds.x_train)
    budget = dataclasses.replace(R.BUDGETS["smoke"], ig_victims=2, ig_iterations=4,
                                 wide_kappas=(), dp_kappas=(100,), batch_sizes=(1, 2))
    per, info, _ = R.gradient_inversion_experiment("lenet5_1998", ds, stats, budget, 0, big=False)
    assert info["victims"] == 2 and len(per["none|None"]) == 2
    assert {"natural|50.0", "white|300.0", "personalized|300.0", "dpsgd|100.0"} <= set(per)
    assert all(np.isfinite(v).all() for v in per.values())
    mse, settings = R.batch_size_experiment(ds, budget, 0)
    assert set(mse) == {"none", "dp", "constant_noise"} and set(mse["none"]) == {"1", "2"}
    # 6 uploads (3 mechanisms × 2 sizes), all in one call where the memory lets them
    assert settings["attack_victims_per_call"] == 6
    # a fixed split is what runs and what is recorded (Fig 6 is repeatable on any machine)
    split = dataclasses.replace(budget, batch_victims_per_call=3)
    mse3, settings3 = R.batch_size_experiment(ds, split, 0)
    assert settings3["attack_victims_per_call"] == 3 and set(mse3) == set(mse)


def test_a_batch_size_no_class_can_fill_is_named():
    """Batches are drawn from one class without replacement: a size larger than
    every class's test examples is refused by name, not by NumPy."""
    import dataclasses

    from fedsim.data import synthetic_dataset

    ds = synthetic_dataset(seed=0, image_size=32, num_train=20, num_test=10)
    budget = dataclasses.replace(R.BUDGETS["smoke"], batch_sizes=(50,))
    with pytest.raises(ValueError, match=r"batch size 50: no class has 50 test examples"):
        R.batch_size_experiment(ds, budget, 0)


@pytest.mark.slow
@pytest.mark.skipif(not __import__("pathlib").Path("/usr/share/datasets/fashion-mnist").exists(),
                    reason="apt package dataset-fashion-mnist not installed")
def test_smoke_run_end_to_end_writes_the_issue_shape(tmp_path):
    """One `--smoke` run of every part: the results JSON has the issue's shape."""
    import json

    R.main(["--smoke", "--out", str(tmp_path)])
    res = json.loads((tmp_path / "tan2024_smoke.json").read_text())
    allowed = {"none", "natural", "white", "personalized", "dpsgd", "dppsac", "compress"}
    assert res["rows"] and {r["channel"] for r in res["rows"]} <= allowed
    for r in res["rows"]:
        assert {"dataset", "model", "channel", "kappa", "accuracy", "ig_mse", "mi_mse",
                "mia_auc", "gdc"} <= set(r)
        assert "seed" in r or r["source"] == "fig9" and r["seeds"]  # Fig 9: a mean over seeds
    trained = [r for r in res["rows"] if r["accuracy"] is not None]
    assert trained and all(0.0 <= r["accuracy"] <= 1.0 for r in trained)
    assert any(r["channel"] == "natural" and r["gdc"] is not None for r in trained)
    assert res["timing"] and res["paper"] and res["checks"]
    assert set(res["parts"]) >= {"timing", "fig9", "batch", "train"}
    assert any(k.startswith("ig:") for k in res["parts"])
    assert all(p["seed"] == 0 and p["mode"] == "smoke" for p in res["parts"].values())
    assert (tmp_path / "tan2024_smoke.md").read_text().count("Acceptance checks") == 1
    assert (tmp_path / "tan2024_fig14_smoke.png").exists()


def _mia_inputs():
    m = build_model("mlp")
    f, p = make_apply_fn(m), init_params(m, SHAPE, jax.random.key(0))
    rng = np.random.default_rng(5)
    x = rng.random((40, *SHAPE), dtype=np.float32)
    y = rng.integers(0, 10, 40)
    return f, p, x[:20], y[:20], x[20:], y[20:]


def test_mia_aucs_reports_the_median_over_its_attack_keys():
    args = _mia_inputs()
    keys = R.mia_attack_keys(0, 3)
    out = R.mia_aucs(*args, keys, 20, 10)
    assert len(out["learned_per_key"]) == 3 and out["known"] == 10 and out["scored"] == 10
    assert out["learned"] == float(np.median(out["learned_per_key"]))
    # Each key's AUC is the attack trained from that key alone (one key checked: every
    # training compiles afresh, ~2 s each).
    alone = R.mia_aucs(*args, keys[1:2], 20, 10)
    assert alone["learned"] == out["learned_per_key"][1]
    assert alone["loss_threshold"] == out["loss_threshold"]  # keyless


def test_mia_attack_keys_are_a_named_stream_per_seed():
    a, b = R.mia_attack_keys(0, 4), R.mia_attack_keys(1, 4)
    data = lambda k: np.asarray(jax.random.key_data(k))
    assert data(a).shape[0] == 4 and len({tuple(d) for d in data(a)}) == 4
    np.testing.assert_array_equal(data(a), data(R.mia_attack_keys(0, 4)))  # same seed: same keys
    assert not np.array_equal(data(a), data(b))
    # Not the engine's keys of the same seed (init: fold_in 0, rounds: fold_in 1).
    engine = {tuple(np.asarray(jax.random.key_data(jax.random.fold_in(jax.random.key(0), i))))
              for i in (0, 1)}
    assert not engine & {tuple(d) for d in data(a)}
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="count must be an integer >= 1"):
            R.mia_attack_keys(0, bad)


@pytest.mark.parametrize("bad", [jax.random.key(0), jax.random.split(jax.random.key(0), 0),
                                 jax.random.split(jax.random.key(0), (2, 2))])
def test_mia_aucs_rejects_keys_that_are_not_a_key_list(bad):
    with pytest.raises(ValueError, match="1-D array of at least one typed key"):
        R.mia_aucs(*_mia_inputs(), bad, 5, 10)
