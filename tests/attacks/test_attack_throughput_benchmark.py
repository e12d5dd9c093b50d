"""benchmarks/attack_throughput.py: arguments, the PyTorch port of the models, the table."""

import jax
import numpy as np
import pytest

from benchmarks import attack_throughput as AT
from fedsim.models import build_model, init_params, make_apply_fn


@pytest.mark.parametrize("argv, message", [
    (["--victims", "0"], "expected a positive integer"),
    (["--image-size", "32"], "apply to --model lenet"),
    (["--model", "lenet", "--image-size", "3"], "at least 4"),
    (["--model", "resnet"], "invalid choice"),
])
def test_bad_arguments_are_named(argv, message, capsys):
    with pytest.raises(SystemExit):
        AT.parse_args(argv)
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("model_name, shape", [("mlp", AT.SHAPE), ("lenet", (12, 12, 3))])
def test_the_pytorch_port_computes_the_jax_model(model_name, shape):
    torch = pytest.importorskip("torch")
    model = build_model(model_name)
    params = init_params(model, shape, jax.random.key(0))
    x = np.random.default_rng(0).random((2, *shape)).astype(np.float32)
    want = np.asarray(make_apply_fn(model)(params, x))
    _, forward = AT.torch_model(params, model_name, torch, "cpu")
    got = forward(torch.tensor(x)).detach().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_the_table_compares_at_the_largest_victim_count():
    meta = {"attack": "Inverting Gradients, DLG LeNet", "mode": "full", "iterations": 10,
            "repeats": 1, "device": "cpu", "commit": "abc"}
    row = lambda impl, v, ips: {"impl": impl, "victims": v, "seconds_median": 1.0,
                                "iters_per_s": ips}
    rows = [row("jax vmap (shared global params)", 8, 100),
            row("jax vmap (shared global params)", 256, 600),
            row("jax vmap (per-victim params)", 256, 900),
            row("pytorch loop (torch, cuda)", 8, 50), row("pytorch loop (torch, cuda)", 256, 100)]
    text = AT.markdown(meta, rows, [8, 256])
    assert "Acceptance (256 victims, same run): jax vmap (per-victim params) / PyTorch loop = 9.0×" in text


def test_without_pytorch_rows_at_the_largest_count_the_ratio_is_read_at_the_largest_shared_one():
    meta = {"attack": "x", "mode": "full", "iterations": 10, "repeats": 1, "device": "cpu",
            "commit": "abc"}
    row = lambda impl, v, ips: {"impl": impl, "victims": v, "seconds_median": 1.0,
                                "iters_per_s": ips}
    rows = [row("jax vmap (shared global params)", 64, 1000),
            row("jax vmap (shared global params)", 256, 4000),
            row("pytorch loop (torch, cuda)", 64, 100)]
    text = AT.markdown(meta, rows, [64, 256])
    assert "Acceptance (64 victims, same run): jax vmap (shared global params) / PyTorch loop = 10.0×" in text
    assert "At 256 victims, jax vmap (shared global params) reaches 40.0×" in text
    assert "Acceptance" not in AT.markdown(meta, rows[:2], [64, 256])
