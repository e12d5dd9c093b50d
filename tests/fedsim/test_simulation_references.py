"""Simulation round loop, observer, observation store and run directory
checked against independent references.

Each test names the mutation it kills. The references are the documented
contracts (``fedsim.typing.Observation``'s fields, the Adam update rule of
Kingma & Ba 2015 Alg. 1, the FedAvg weighted mean of McMahan et al. 2017
Alg. 1, the evaluation schedule of ``eval.every``), written out here by hand.
"""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedsim.observation_store import load_round, save_round
from fedsim.observer import ObservedUpload
from fedsim.simulation import Simulation
from fedsim.typing import Observation

from .helpers import small_config, small_dataset


def test_observed_upload_reports_the_clients_own_count_batch_and_steps():
    """An observation's ``num_examples``, ``batch_size`` and ``local_steps``.

    Kills, in ``Simulation._observation``:
      * ``steps = ... * -(-n // B)`` → ``... * (n // B)`` (floor for ceil),
      * ``B = ... min(t.batch_size, n)`` → ``t.batch_size`` (a batch larger
        than the client),
      * ``num_examples=n`` → ``num_examples=self.n_max`` (the padded size).

    Reference (``fedsim.typing.Observation``): ``num_examples`` is the client's
    number of examples, here the length of its partition; FedAvg takes
    ``local_epochs · ⌈n / B⌉`` steps of batch ``B = min(batch_size, n)``
    (McMahan et al. 2017, Alg. 1: the local data split into batches of size
    B, E passes). With seed 0 the six clients hold 123, 65, 104, 146, 108 and 54
    examples; batch 100 makes client 0's ⌈123/100⌉ = 2 ≠ ⌊123/100⌋ = 1 and
    client 1's batch its own 65 examples.
    """
    cfg = small_config(**{"training.batch_size": 100, "training.local_epochs": 2,
                          "observer.clients": [0, 1], "observer.rounds": [0]})
    sim = Simulation(cfg, dataset=small_dataset())
    sizes = {c: len(sim.partitions[c]) for c in (0, 1)}
    assert sizes[0] % 100 != 0 and sizes[1] < 100 < max(len(p) for p in sim.partitions)
    _, res = sim.run_round(sim.init_state(), 0)
    seen = {u.observation.client_id: u for u in res.observed}
    assert sorted(seen) == [0, 1]
    for cid, n in sizes.items():
        o = seen[cid].observation
        batch = min(100, n)
        assert o.num_examples == n == len(seen[cid].y) == len(o.labels)
        assert o.batch_size == batch
        assert o.local_steps == 2 * math.ceil(n / batch)
        assert o.round == 0


def test_a_first_adam_step_moves_every_coordinate_by_the_learning_rate():
    """FedAvg under ``training.optimizer: adam`` trains the clients with Adam.

    Kills ``self.client_tx = make_client_optimizer(t) if ... else optax.sgd(t.lr)``
    → ``self.client_tx = optax.sgd(t.lr)`` (the configured client optimizer
    ignored).

    Reference: Adam's first step (Kingma & Ba 2015, Alg. 1, t = 1) has
    m̂ = g and v̂ = g², so Δ = −lr · g / (|g| + ε): every coordinate with
    |g| ≫ ε = 1e-8 moves by exactly lr against its gradient's sign. One local
    step (batch ≥ the client's 123 examples, one epoch) makes the upload that
    first step. Plain SGD would move coordinate i by lr·|g_i| instead. The
    gradient's sign is computed here with ``jax.grad`` of the mean
    cross-entropy over the client's examples.
    """
    lr = 0.01
    cfg = small_config(**{"training.optimizer": "adam", "training.lr": lr,
                          "training.batch_size": 256, "observer.clients": [0],
                          "observer.rounds": [0]})
    sim = Simulation(cfg, dataset=small_dataset())
    state = sim.init_state()
    params = state.params
    _, res = sim.run_round(state, 0)
    (up,) = res.observed
    x, y = jnp.asarray(up.x), jnp.asarray(up.y)

    def loss(p):
        logits = sim.apply_fn(p, x)
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1))

    g = np.concatenate([np.ravel(a) for a in jax.tree_util.tree_leaves(jax.grad(loss)(params))])
    d = np.concatenate([np.ravel(a) for a in jax.tree_util.tree_leaves(up.observation.update)])
    big = np.abs(g) > 1e-5
    assert big.mean() > 0.5
    np.testing.assert_allclose(d[big], -lr * np.sign(g[big]), rtol=1e-3)


def test_observing_a_loop_round_leaves_its_model_as_unobserved():
    """The loop strategy aggregates an observed client with its example weight.

    Kills, in ``Simulation._train_cohort`` (loop path),
    ``self._accumulate(wsum, wtot, out.update, out.num_examples)`` →
    ``self._accumulate(wsum, wtot, out.update, jnp.ones_like(out.num_examples))``.

    Reference (property): observing reads an upload, it does not change what
    the server aggregates, so the FedAvg mean Σ n_c Δ_c / Σ n_c (McMahan et al.
    2017, Alg. 1) and the model after the round are those of the same round
    unobserved, up to float rounding between a client run alone and in a group.
    """
    ds = small_dataset()
    base = {"training.client_parallelism": "loop", "training.rounds": 1}
    members = [int(c) for c in Simulation(small_config(**base), dataset=ds).cohort(0)]
    params = []
    for observer in ({}, {"observer.clients": members[:1], "observer.rounds": [0]}):
        sim = Simulation(small_config(**base, **observer), dataset=ds)
        state, res = sim.run_round(sim.init_state(), 0)
        assert [int(c) for c in res.cohort] == members
        params.append(state.params)
    (plain, watched) = params
    for a, b in zip(jax.tree_util.tree_leaves(plain), jax.tree_util.tree_leaves(watched)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-6)


def _upload(cid, round_idx, params, rng):
    update = jax.tree_util.tree_map(lambda a: jnp.asarray(rng.normal(size=a.shape), a.dtype),
                                    params)
    x = rng.normal(size=(3, 2)).astype(np.float32)
    y = np.arange(3, dtype=np.int32) + cid
    obs = Observation(update=update, params=params, apply_fn=None, algorithm="fedavg", lr=0.1,
                      local_steps=2, batch_size=3, num_examples=3, labels=jnp.asarray(y),
                      input_shape=(2,), num_classes=5, client_id=cid, round=round_idx)
    return ObservedUpload(obs, x, y)


def test_a_stored_round_of_a_many_leaved_model_reads_back_leaf_for_leaf(tmp_path):
    """Global params of more than ten leaves read back in their own order.

    Kills ``f"params/{i:05d}"`` → ``f"params/{i}"`` in ``save_round``: the
    reader sorts the stored names, and unpadded "params/10" sorts before
    "params/2", so a model of more than ten leaves (LeNet-5, VGG) would read
    its leaves shuffled.

    Reference (property): save then load is the identity on every leaf.
    """
    rng = np.random.default_rng(0)
    params = {f"layer{i:02d}": jnp.asarray(rng.normal(size=(i + 1,)), jnp.float32)
              for i in range(12)}
    save_round(tmp_path, [_upload(2, 3, params, rng)], "fp")
    (got,) = load_round(tmp_path, 3, "fp", params, None, [2])
    for a, b in zip(jax.tree_util.tree_leaves(params),
                    jax.tree_util.tree_leaves(got.observation.params)):
        np.testing.assert_array_equal(np.asarray(b), np.asarray(a))


def test_a_run_evaluates_after_every_eval_every_rounds_and_after_the_last(tmp_path):
    """metrics.jsonl carries test numbers on rounds r with (r + 1) % every == 0 and the last.

    Kills, in ``fedsim.run._run_rounds``, ``(r + 1) % cfg.eval.every == 0`` →
    ``r % cfg.eval.every == 0`` (evaluating before round ``every`` is done) and
    the dropped ``or r == rounds - 1`` (a last round off the schedule left
    unevaluated, the summary reporting an older model's accuracy).

    Reference: ``eval.every = k`` evaluates the global model after rounds
    k, 2k, ... (1-based counts of rounds done) and after the final round, whose
    numbers the summary reports. With 5 rounds and k = 2: after rounds 2, 4, 5,
    i.e. 0-based rows 1, 3, 4. The summary's test numbers are then the last
    row's, and the last row's accuracy is that of ``Simulation.evaluate`` on
    the final model.
    """
    from fedsim.results import read_metrics
    from fedsim.run import run_simulation

    cfg = small_config(**{"training.rounds": 5, "eval.every": 2, "output.dir": str(tmp_path)})
    sim = Simulation(cfg, dataset=small_dataset())
    summary = run_simulation(cfg, sim=sim, quiet=True)
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["round"] for r in rows] == [0, 1, 2, 3, 4]
    assert [r["round"] for r in rows if r.get("test_accuracy") is not None] == [1, 3, 4]
    acc, loss = sim.evaluate(summary["final_state"].params)
    assert rows[-1]["test_accuracy"] == summary["test_accuracy"] == pytest.approx(acc, abs=1e-7)
    assert rows[-1]["test_loss"] == summary["test_loss"] == pytest.approx(loss, rel=1e-6)
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["final_train_loss"] == rows[-1]["train_loss"]
    assert on_disk["rounds_trained"] == on_disk["rounds"] == 5


def test_a_stored_round_reads_back_in_the_order_of_the_clients_asked_for(tmp_path):
    """``load_round`` returns the uploads in the order of ``clients``.

    Kills ``for cid in clients:`` → ``for cid in sorted(by_client):`` in
    ``load_round``.

    Reference: ``load_round``'s docstring ("The round's uploads, in the order
    of ``clients``"); each upload's client id, labels and update identify it.
    """
    rng = np.random.default_rng(1)
    params = {"w": jnp.zeros((4,), jnp.float32)}
    ups = {c: _upload(c, 0, params, rng) for c in (1, 4)}
    save_round(tmp_path, [ups[1], ups[4]], "fp")
    got = load_round(tmp_path, 0, "fp", params, None, [4, 1])
    assert [u.observation.client_id for u in got] == [4, 1]
    for u, c in zip(got, (4, 1)):
        np.testing.assert_array_equal(u.y, ups[c].y)
        np.testing.assert_array_equal(np.asarray(u.observation.update["w"]),
                                      np.asarray(ups[c].observation.update["w"]))


def test_the_summarys_mask_density_is_the_share_of_all_weights_kept(tmp_path):
    """``summary.json``'s ``mask_density`` is (weights kept) / (weights), over the whole model.

    Kills, in ``fedsim.run.run_simulation``, ``sum(np.sum(m)) / sum(m.size)`` →
    ``np.mean([np.mean(m) for m in leaves])`` (the mean of the per-layer
    densities, which weighs a 10-weight bias like a 4,096-weight kernel).

    Reference: counted by hand on a global mask (``Simulation.use_global_mask``)
    that prunes half of the largest leaf and keeps every other weight, so the
    whole-model share, 1 − (size / 2) / total, differs from the per-leaf mean.
    """
    from fedsim.run import run_simulation

    cfg = small_config(**{"training.rounds": 1, "output.dir": str(tmp_path)})
    sim = Simulation(cfg, dataset=small_dataset())
    params = sim.init_state().params
    leaves, treedef = jax.tree_util.tree_flatten(params)
    big = int(np.argmax([a.size for a in leaves]))
    masks = [np.ones(a.shape, np.float32) for a in leaves]
    flat = masks[big].reshape(-1)
    flat[: flat.size // 2] = 0.0
    masks[big] = flat.reshape(leaves[big].shape)
    sim.use_global_mask(jax.tree_util.tree_unflatten(treedef, masks), sim.init_state())
    total = sum(a.size for a in leaves)
    want = 1.0 - (leaves[big].size // 2) / total
    assert abs(want - np.mean([m.mean() for m in masks])) > 1e-3
    run_simulation(cfg, sim=sim, quiet=True)
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["mask_density"] == pytest.approx(want, rel=1e-6)  # float32 sums


def test_a_rounds_train_loss_leaves_out_only_its_skipped_clients():
    """``RoundResult.train_loss`` with some (not all) clients skipped for NaN.

    Kills ``ok = weights > 0`` → ``ok = weights >= 0`` in ``Simulation.run_round``:
    a client whose training diverged keeps its NaN loss at weight 0, and
    NaN · 0 is NaN, so the round's loss read NaN (``null`` in metrics.jsonl)
    although clients counted.

    Reference: ``RoundResult.train_loss`` is the example-weighted mean over the
    clients counted, Σ n_c L_c / Σ n_c over the clients not skipped. A
    layer-stage defense makes the gradients of clients with fewer than 100
    examples NaN (their training, loss included, diverges) and leaves the
    others' as they are, so their losses are those of the run without it;
    each kept client's L_c is recomputed here from the round's documented key
    (``fold_in(client_key, c)``) on a simulation without the defense.
    """
    from fedsim.hooks import Defense

    def apply(delta, state, *, key, context):
        bad = context.num_examples < 100
        return jax.tree_util.tree_map(lambda d: jnp.where(bad, jnp.nan, d), delta), state

    nan_small = Defense(init=lambda p: (), apply=apply, stage="layer", name="nan_small")
    ds = small_dataset()
    cfg = small_config(**{"training.on_nonfinite": "skip_client"})
    plain = Simulation(cfg, dataset=ds)
    counts = np.asarray(plain.client_counts)
    r = next(r for r in range(20) if 0 < np.sum(counts[plain.cohort(r)] < 100) < 3)
    sim = Simulation(cfg, dataset=ds, defenses={"layer": nan_small})
    state = sim.init_state()
    _, res = sim.run_round(state, r)
    ids = [int(c) for c in res.cohort]
    kept = [c for c in ids if counts[c] >= 100]
    assert sorted(res.skipped_clients) == sorted(c for c in ids if counts[c] < 100)
    _, ckey = plain.round_keys(r)
    losses = {c: float(plain.client_update(state.params, plain.client_data(c), {},
                                           jax.random.fold_in(ckey, c)).loss) for c in kept}
    want = sum(counts[c] * losses[c] for c in kept) / sum(counts[c] for c in kept)
    assert res.train_loss == pytest.approx(want, rel=1e-5)
