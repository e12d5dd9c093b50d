"""SGI (paper 002 Alg 2): mask recovery, the masked model, and SGI vs GI."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attacks import run_attack
from attacks.gradient_inversion import matching_loss
from attacks.metrics import psnr
from attacks.sgi import recover_mask
from defenses.pruning import apply_mask, random_mask
from fedsim.client import masked_mean_loss
from fedsim.models import build_model, init_params, make_apply_fn
from fedsim.typing import Observation


@pytest.fixture(scope="module")
def mlp():
    model = build_model("mlp", 10)
    params = init_params(model, (16, 16, 1), jax.random.key(0))
    return params, make_apply_fn(model)


def _pruned_upload(params, apply_fn, x, y, p, key):
    mask = random_mask(key, params, p)
    pm = apply_mask(params, mask)
    g = jax.grad(masked_mean_loss, argnums=1)(apply_fn, pm, x, y, jnp.ones(x.shape[0]))
    upd = jax.tree_util.tree_map(lambda a: -0.25 * a, apply_mask(g, mask))
    obs = Observation(upd, pm, apply_fn, "fedsgd", 0.25, 1, x.shape[0], x.shape[0], y,
                      (16, 16, 1), 10)
    return obs, mask


def test_recover_mask_from_the_upload_zeros(mlp):
    params, apply_fn = mlp
    x = jax.random.uniform(jax.random.key(1), (2, 16, 16, 1))
    y = jnp.array([3, 7])
    obs, mask = _pruned_upload(params, apply_fn, x, y, 0.4, jax.random.key(2))
    # Every kept coordinate of this MLP's gradient is nonzero, so the zeros are the mask.
    chex.assert_trees_all_close(recover_mask(obs.update), mask)


def test_sgi_is_gi_on_a_dense_upload_and_pairs_with_it(mlp):
    """One route: SGI only switches the core's mask on; without zeros it is GI exactly."""
    params, apply_fn = mlp
    x = jax.random.uniform(jax.random.key(1), (1, 16, 16, 1))
    y = jnp.array([4])
    obs, _ = _pruned_upload(params, apply_fn, x, y, 0.0, jax.random.key(3))
    dense = jax.tree_util.tree_map(lambda u: jnp.where(u == 0, 1e-30, u), obs.update)
    obs = obs._replace(update=dense)
    cfg = {"iterations": 3, "restarts": 2}
    gi = run_attack("inverting_gradients", obs, cfg, jax.random.key(7))
    sgi = run_attack("sgi", obs, cfg, jax.random.key(7))
    np.testing.assert_array_equal(np.asarray(gi.x), np.asarray(sgi.x))
    assert sgi.extras["mask_density"] == 1.0
    # On a sparse upload the two differ (the mask changes the loss).
    sparse, _ = _pruned_upload(params, apply_fn, x, y, 0.6, jax.random.key(3))
    gi = run_attack("inverting_gradients", sparse, cfg, jax.random.key(7))
    sgi = run_attack("sgi", sparse, cfg, jax.random.key(7))
    assert float(gi.loss) != float(sgi.loss)


def test_true_input_is_a_zero_of_sgi_loss_but_not_of_gi(mlp):
    """The mechanism of Alg 2: with the mask, the truth matches the sparse upload exactly."""
    params, apply_fn = mlp
    x = jax.random.uniform(jax.random.key(1), (1, 16, 16, 1))
    y = jnp.array([4])
    obs, mask = _pruned_upload(params, apply_fn, x, y, 0.6, jax.random.key(3))
    target = jax.tree_util.tree_map(lambda d: -d / 0.25, obs.update)
    dense = jax.grad(masked_mean_loss, argnums=1)(apply_fn, obs.params, x, y, jnp.ones(1))
    gi = float(matching_loss(dense, target, "cosine"))
    sgi = float(matching_loss(apply_mask(dense, mask), target, "cosine"))
    assert sgi < 1e-5 < 0.1 < gi


@pytest.mark.slow
def test_sgi_beats_gi_on_a_pruned_upload(mlp):
    params, apply_fn = mlp
    x = jax.random.uniform(jax.random.key(5), (1, 16, 16, 1))
    x = jax.image.resize(x[:, ::4, ::4], (1, 16, 16, 1), "linear")  # smooth image
    y = jnp.array([2])
    obs, _ = _pruned_upload(params, apply_fn, x, y, 0.7, jax.random.key(6))
    cfg = {"iterations": 300, "tv": 1e-3}
    gi = run_attack("inverting_gradients", obs, cfg, jax.random.key(7))
    sgi = run_attack("sgi", obs, cfg, jax.random.key(7))
    assert float(sgi.loss) < float(gi.loss)
    assert float(psnr(sgi.x, x).mean()) > float(psnr(gi.x, x).mean())


def test_sgi_on_weight_uploads_reads_the_mask_off_the_weights(mlp):
    """Alg 2 lines 3–4 on a weight upload ŵ = (w_g + Δ) ⊙ m̂ carried as ŵ − w_g:
    the SGI view is Δ ⊙ m̂ (withheld coordinates leave), GI's is ŵ − w_g."""
    from attacks.sgi import from_weight_upload
    params, apply_fn = mlp
    x = jax.random.uniform(jax.random.key(1), (1, 16, 16, 1))
    y = jnp.array([4])
    obs, _ = _pruned_upload(params, apply_fn, x, y, 0.0, jax.random.key(3))
    keep = random_mask(jax.random.key(5), params, 0.3)
    as_weights = jax.tree_util.tree_map(lambda d, g, k: d * k - g * (1 - k), obs.update,
                                        obs.params, keep)
    w_obs = obs._replace(update=as_weights)
    view = from_weight_upload(w_obs)
    chex.assert_trees_all_close(view.update, apply_mask(obs.update, keep))
    cfg = {"iterations": 3, "restarts": 1}
    a = run_attack("sgi", w_obs, {**cfg, "upload": "weights"}, jax.random.key(7))
    # The view's zeros are the withheld weights here (this MLP's gradient has none).
    b = run_attack("sgi", view, {**cfg, "mask": "support"}, jax.random.key(7))
    np.testing.assert_array_equal(np.asarray(a.x), np.asarray(b.x))
    with pytest.raises(ValueError, match="attack.config.upload"):
        run_attack("sgi", w_obs, {**cfg, "upload": "grads"}, jax.random.key(7))


def _bordered_upload(params, apply_fn, seed):
    """A FedSGD upload of an image 0 outside its centre: the first-layer weights of
    the border pixels get no change, though every weight is shared."""
    rng = np.random.default_rng(seed)
    x = np.zeros((1, 16, 16, 1), np.float32)
    x[0, 4:-4, 4:-4] = rng.uniform(0.2, 1.0, (8, 8, 1))
    x, y = jnp.asarray(x), jnp.array([seed])
    obs, _ = _pruned_upload(params, apply_fn, x, y, 0.0, jax.random.key(seed))
    return obs, x


@pytest.mark.parametrize("upload", ["update", "weights"])
def test_a_shared_weight_with_no_change_stays_in_sgis_mask(mlp, upload):
    """Alg 2 line 3 reads the mask off the client's weights (ŵ = w_g + Δ ≠ 0): with
    nothing pruned, SGI is GI. The upload's zero pattern ("support") also drops the
    shared weights whose change is exactly 0 (here 75 % of the first layer), and with
    them the constraint that the border is black."""
    from attacks.sgi import model_mask

    params, apply_fn = mlp
    obs, x = _bordered_upload(params, apply_fn, 3)
    assert np.mean(np.asarray(obs.update["Dense_0"]["kernel"]) == 0) > 0.5
    chex.assert_trees_all_close(model_mask(obs), jax.tree_util.tree_map(jnp.ones_like, obs.update))
    cfg = {"iterations": 150, "tv": 0.0}
    gi = run_attack("inverting_gradients", obs, cfg, jax.random.key(7))
    cfg["upload"] = upload
    sgi = run_attack("sgi", obs, cfg, jax.random.key(7))
    # Equal up to float reassociation (the mask is an input here, a constant 1 nowhere).
    np.testing.assert_allclose(np.asarray(gi.x), np.asarray(sgi.x), atol=1e-3)
    assert sgi.extras["mask_density"] == 1.0
    support = run_attack("sgi", obs, {**cfg, "mask": "support"}, jax.random.key(7))
    border = np.ones((16, 16, 1), bool)
    border[4:-4, 4:-4] = False
    border_mse = lambda r: float(np.mean((np.asarray(r.x)[0][border] - np.asarray(x)[0][border]) ** 2))
    assert support.extras["mask_density"] < 0.5
    assert border_mse(support) > 100 * border_mse(sgi)


def test_sgis_mask_on_a_pruned_convnet_keeps_every_kept_kernel_weight():
    """LeNet-5 at batch 8: a third of the gradient is exactly 0 (ReLU units dead for
    the whole batch). Alg 2's mask, 1[w_g + Δ ≠ 0], is the pruning mask on the
    kernels; the upload's zeros miss shared kernel weights."""
    from attacks.sgi import model_mask

    model = build_model("lenet5", 10)
    apply_fn = make_apply_fn(model)
    params = init_params(model, (16, 16, 1), jax.random.key(0))
    mask = random_mask(jax.random.key(2), params, 0.5)
    pm = apply_mask(params, mask)
    x = jax.random.uniform(jax.random.key(1), (8, 16, 16, 1))
    y = jnp.arange(8)
    g = jax.grad(masked_mean_loss, argnums=1)(apply_fn, pm, x, y, jnp.ones(8))
    upd = jax.tree_util.tree_map(lambda a: -0.25 * a, apply_mask(g, mask))
    obs = Observation(upd, pm, apply_fn, "fedsgd", 0.25, 1, 8, 8, y, (16, 16, 1), 10)
    kernels = lambda t: [v["kernel"] for v in t.values()]
    for got, want in zip(kernels(model_mask(obs)), kernels(mask)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    kept = sum(float(np.sum(np.asarray(k))) for k in kernels(mask))
    in_support = sum(float(np.sum(np.asarray(k))) for k in kernels(recover_mask(upd)))
    assert in_support < 0.9 * kept

