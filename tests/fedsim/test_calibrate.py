import json

import pytest

from fedsim import calibrate
from fedsim.simulation import Simulation

from .helpers import small_config, small_dataset


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDSIM_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_auto_picks_the_fastest_measured_and_caches_it(cache_dir, monkeypatch):
    cfg = small_config(**{"training.client_parallelism": "auto"})
    ds = small_dataset()
    fake = {"loop": 3e-3, "vmap": 1e-3, "map": 2e-3, "chunked": 5e-3}
    calls = []

    def fake_measure(sim, *a, **k):
        calls.append(1)
        return dict(fake)

    monkeypatch.setattr(calibrate, "measure", fake_measure)
    sim = Simulation(cfg, dataset=ds)
    assert sim.strategy == "vmap"
    assert "auto -> vmap" in sim.strategy_reason and "measured now" in sim.strategy_reason
    cache = json.loads((cache_dir / "calibration.json").read_text())
    assert [v["choice"] for v in cache.values()] == ["vmap"]
    # Second build: read from the cache, no new measurement.
    sim2 = Simulation(cfg, dataset=ds)
    assert sim2.strategy == "vmap" and "cached" in sim2.strategy_reason
    assert len(calls) == 1
    # A different setting (cohort size) is a different cache entry.
    Simulation(small_config(**{"training.client_parallelism": "auto",
                               "training.clients_per_round": 2}), dataset=ds)
    assert len(calls) == 2


def test_real_measurement_runs_every_candidate(cache_dir):
    cfg = small_config(**{"training.client_parallelism": "loop"})
    sim = Simulation(cfg, dataset=small_dataset())
    timings = calibrate.measure(sim, clients=2, repeats=1)
    assert set(timings) == set(calibrate.CANDIDATES)
    assert all(0 < t < 60 for t in timings.values())
    # The measured simulation still trains with any chosen strategy.
    sim.strategy = min(timings, key=timings.get)
    sim._compile()
    state, res = sim.run_round(sim.init_state(), 0)
    assert res.train_loss > 0


def test_torn_cache_file_is_remeasured(cache_dir, monkeypatch):
    (cache_dir / "calibration.json").write_text("{not json")
    monkeypatch.setattr(calibrate, "measure", lambda sim, *a, **k: {"loop": 1.0, "map": 2.0})
    sim = Simulation(small_config(**{"training.client_parallelism": "auto"}),
                     dataset=small_dataset())
    assert sim.strategy == "loop"
