import json
import logging

import jax
import numpy as np
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
    # The strategies agree only up to float rounding: the log says how to repeat the run.
    assert sim.strategy_reason.endswith("set training.client_parallelism: vmap to repeat "
                                        "this run's numbers where auto may choose otherwise")
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


def test_the_winner_reuses_what_calibration_compiled(cache_dir):
    """Calibration's executables serve the run: building the winner after measuring
    compiles nothing again, and the numbers equal a fresh simulation's."""
    # k = 2 of a cohort of 3: the loop runs one 2-client call and one single call.
    over = {"training.client_parallelism": "loop", "training.loop_clients_per_call": 2}
    ds = small_dataset(n=120)  # 2 local steps a client: cheap compiles
    sim = Simulation(small_config(**over), dataset=ds)
    calibrate.measure(sim, candidates=("loop", "vmap"), clients=3, repeats=1)
    fns = dict(sim._jitted["shared"])
    vmap_step = sim._jitted["vmap"]
    trained = ("_run_and_accumulate", "_run_and_accumulate_many")
    sizes = {name: fns[name]._cache_size() for name in trained}
    assert all(n == 1 for n in sizes.values()) and vmap_step._cache_size() == 1
    for winner in ("loop", "vmap"):
        sim.strategy = winner
        sim._compile(reuse=True)
        assert all(getattr(sim, name) is fn for name, fn in fns.items())
        if winner == "vmap":
            assert sim._cohort_step is vmap_step
        state, res = sim.run_round(sim.init_state(), 0)
        # Training traced nothing new (evaluation and the server step may).
        assert {name: fns[name]._cache_size() for name in trained} == sizes
        assert vmap_step._cache_size() == 1
        fresh = Simulation(small_config(**{**over, "training.client_parallelism": winner}),
                           dataset=ds)
        ref_state, ref = fresh.run_round(fresh.init_state(), 0)
        assert res.train_loss == ref.train_loss
        for a, b in zip(jax.tree_util.tree_leaves(state.params),
                        jax.tree_util.tree_leaves(ref_state.params)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_plain_compile_rebuilds_everything(cache_dir):
    sim = Simulation(small_config(**{"training.client_parallelism": "loop"}),
                     dataset=small_dataset())
    before = sim._run_client
    sim._compile()
    assert sim._run_client is not before  # e.g. after replacing client_update (tests do)
    again = sim._run_client
    sim._compile(reuse=True)
    assert sim._run_client is again


def test_contenders_are_the_candidates_within_the_factor_of_the_best():
    t = {"loop": 2.0, "vmap": 2.9, "map": 3.1, "chunked": float("inf")}
    assert calibrate.contenders(t, factor=1.5) == ["loop", "vmap"]
    assert calibrate.contenders(t, factor=1.0) == ["loop"]
    assert calibrate.contenders({"loop": float("inf")}) == []


def _gpu_like_measure(calls):
    """Short cohort: map ahead by a little; real cohort: vmap far ahead (H200's shape)."""
    short = {"map": 1.55e-3, "chunked": 1.57e-3, "loop": 1.99e-3, "vmap": 2.01e-3}
    full = {"vmap": 0.12e-3, "chunked": 0.19e-3, "map": 0.37e-3, "loop": 0.37e-3}

    def fake(sim, candidates=calibrate.CANDIDATES, clients=None, repeats=calibrate.REPEATS):
        calls.append((tuple(candidates), clients))
        table = short if clients is None else full
        return {c: table[c] for c in candidates}
    return fake


def _forty_clients_capped_at_24(monkeypatch):
    """GPU-like timings, a 40-client cohort and a second stage capped at 24 clients:
    returns (config, the measure calls made)."""
    calls = []
    monkeypatch.setattr(calibrate, "measure", _gpu_like_measure(calls))
    monkeypatch.setattr(calibrate, "COHORT_CALIBRATION_CLIENTS", 24)
    cfg = small_config(**{"training.client_parallelism": "auto", "data.num_clients": 40,
                          "training.clients_per_round": 40})
    return cfg, calls


def test_close_contenders_are_timed_again_on_the_real_cohort(cache_dir, monkeypatch):
    calls = []
    monkeypatch.setattr(calibrate, "measure", _gpu_like_measure(calls))
    cfg = small_config(**{"training.client_parallelism": "auto", "data.num_clients": 40,
                          "training.clients_per_round": 40})
    sim = Simulation(cfg, dataset=small_dataset(n=1200))
    # map wins the 16-client cohort; vmap wins the real one.
    assert sim.strategy == "vmap"
    assert calls == [(calibrate.CANDIDATES, None), (("map", "chunked", "loop", "vmap"), 40)]
    assert "on 16 clients map 1.55" in sim.strategy_reason
    assert "the 40-client cohort vmap 0.12" in sim.strategy_reason
    entry, = json.loads((cache_dir / "calibration.json").read_text()).values()
    assert entry["choice"] == "vmap" and entry["cohort_timings"]["vmap"] == 0.12e-3
    # The cached entry gives the same choice and reason without measuring.
    again = Simulation(cfg, dataset=small_dataset(n=1200))
    assert again.strategy == "vmap" and len(calls) == 2
    assert "the 40-client cohort vmap 0.12" in again.strategy_reason


def test_the_second_stage_times_at_most_cohort_calibration_clients(cache_dir, monkeypatch):
    # Timing vmap on a whole large cohort took 7 GB and slowed the next rounds.
    cfg, calls = _forty_clients_capped_at_24(monkeypatch)
    sim = Simulation(cfg, dataset=small_dataset(n=1200))
    assert sim.strategy == "vmap"
    assert calls == [(calibrate.CANDIDATES, None), (("map", "chunked", "loop", "vmap"), 24)]
    assert "again on 24 clients of the 40-client cohort vmap 0.12" in sim.strategy_reason
    # The cached entry keeps how many clients its second stage timed.
    again = Simulation(cfg, dataset=small_dataset(n=1200))
    assert len(calls) == 2 and "cached" in again.strategy_reason
    assert "again on 24 clients of the 40-client cohort" in again.strategy_reason
    cache = json.loads((cache_dir / "calibration.json").read_text())
    (entry,) = cache.values()
    del entry["cohort_clients"]  # an entry from before the cap: it timed the whole cohort
    (cache_dir / "calibration.json").write_text(json.dumps(cache))
    old = Simulation(cfg, dataset=small_dataset(n=1200))
    assert len(calls) == 2 and "again on the 40-client cohort" in old.strategy_reason


def test_a_clear_winner_or_a_short_cohort_is_measured_once(cache_dir, monkeypatch):
    calls = []

    def cpu_like(sim, candidates=calibrate.CANDIDATES, clients=None, repeats=calibrate.REPEATS):
        calls.append(clients)
        return {"loop": 7.5e-3, "vmap": 14.6e-3, "map": 66e-3, "chunked": 120e-3}

    monkeypatch.setattr(calibrate, "measure", cpu_like)
    big = {"training.client_parallelism": "auto", "data.num_clients": 40,
           "training.clients_per_round": 40}
    sim = Simulation(small_config(**big), dataset=small_dataset(n=1200))
    assert sim.strategy == "loop" and calls == [None]
    assert "16 clients" not in sim.strategy_reason  # one stage, one ranking
    # Close contenders but a cohort no larger than the short one: one stage too.
    calls.clear()
    monkeypatch.setattr(calibrate, "measure", _gpu_like_measure(calls))
    sim = Simulation(small_config(**{"training.client_parallelism": "auto"}),
                     dataset=small_dataset())
    assert sim.strategy == "map" and len(calls) == 1


def test_the_second_stage_really_runs_on_the_whole_cohort(cache_dir, monkeypatch):
    # Real measurements: every candidate a contender, a 2-client short cohort.
    monkeypatch.setattr(calibrate, "CALIBRATION_CLIENTS", 2)
    monkeypatch.setattr(calibrate, "CONTENDER_FACTOR", float("inf"))
    sizes = []
    real = calibrate.measure

    def spy(sim, candidates=calibrate.CANDIDATES, clients=None, repeats=calibrate.REPEATS):
        out = real(sim, candidates=candidates, clients=clients, repeats=1)
        sizes.append((len(out), clients))
        return out

    monkeypatch.setattr(calibrate, "measure", spy)
    sim = Simulation(small_config(**{"training.client_parallelism": "auto",
                                     "training.clients_per_round": 4}),
                     dataset=small_dataset(n=240))
    assert sizes == [(4, None), (4, 4)]
    assert "the 4-client cohort" in sim.strategy_reason
    state, res = sim.run_round(sim.init_state(), 0)
    assert np.isfinite(res.train_loss)


class _ClockedSim:
    """Just what :func:`calibrate.measure` touches, on a fake clock: each cohort
    step advances it by its strategy's cost per client × clients, plus a drift."""

    def __init__(self, cost, clock, drift=lambda n: 0.0, fail=()):
        import contextlib
        from types import SimpleNamespace
        self.cfg = SimpleNamespace(training=SimpleNamespace(clients_per_round=8))
        self.cost, self.clock, self.drift, self.fail = cost, clock, drift, fail
        self.strategy, self.calls = None, []
        self.numerics = contextlib.nullcontext

    def cohort(self, round_idx):
        return np.arange(self.cfg.training.clients_per_round)

    def round_keys(self, round_idx):
        return None, jax.random.key(0)

    def _compile(self, reuse=False):
        pass

    def init_state(self):
        return None

    def _train_cohort(self, state, ids, ckey, round_idx):
        from types import SimpleNamespace
        self.calls.append(self.strategy)
        if self.strategy in self.fail:
            raise MemoryError("out of memory")
        self.clock[0] += (self.cost[self.strategy] + self.drift(len(self.calls))) * len(ids)
        return (SimpleNamespace(params=np.zeros(1)),)


def test_measure_warms_every_candidate_up_then_times_them_round_robin(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(calibrate.time, "perf_counter", lambda: clock[0])
    # The machine slows down steadily while measuring (drift grows with each call).
    sim = _ClockedSim({"loop": 1.10, "chunked": 1.00}, clock, drift=lambda n: 0.05 * n)
    t = calibrate.measure(sim, candidates=("loop", "chunked"), repeats=3)
    assert sim.calls == ["loop", "chunked"] + ["loop", "chunked"] * 3
    # Interleaved, the drift hits both alike and chunked stays ahead; timed one
    # after the other (loop's 3 calls, then chunked's) it would have lost.
    assert t["chunked"] < t["loop"]
    assert t["loop"] == pytest.approx(1.10 + 0.05 * 5)  # median of calls 3, 5, 7
    assert t["chunked"] == pytest.approx(1.00 + 0.05 * 6)


def test_measure_drops_clear_losers_and_failures(monkeypatch, capsys):
    clock = [0.0]
    monkeypatch.setattr(calibrate.time, "perf_counter", lambda: clock[0])
    sim = _ClockedSim({"loop": 1.0, "vmap": 1.2, "map": 9.0, "chunked": 1.0}, clock,
                      fail=("chunked",))
    t = calibrate.measure(sim, repeats=3)
    assert list(t) == list(calibrate.CANDIDATES)
    assert t["map"] == 9.0 and sim.calls.count("map") == 2  # warm-up + one timed call
    assert t["chunked"] == float("inf") and "chunked failed (MemoryError" in capsys.readouterr().out
    assert t["loop"] == 1.0 and t["vmap"] == pytest.approx(1.2)
    assert sim.calls.count("loop") == sim.calls.count("vmap") == 4


def test_auto_skips_a_winner_that_does_not_fit_the_real_cohort(cache_dir, monkeypatch):
    # vmap wins the 24-client second stage but the 40-client cohort would not fit.
    cfg, calls = _forty_clients_capped_at_24(monkeypatch)
    planned = []
    need = {"vmap": 9 * 2**30, "chunked": 2**30, "map": 2**20}

    def fake_bytes(sim, clients):
        planned.append((sim.strategy, clients))
        return need[sim.strategy]

    monkeypatch.setattr(calibrate.memory, "cohort_step_bytes", fake_bytes)
    monkeypatch.setattr(calibrate.memory, "available_bytes", lambda: 4 * 2**30)
    sim = Simulation(cfg, dataset=small_dataset(n=1200))
    assert sim.strategy == "chunked" and planned == [("vmap", 40), ("chunked", 40)]
    assert "fastest measured that fits in memory" in sim.strategy_reason
    assert ("vmap skipped: its step on the 40-client cohort plans 9.00 GiB, more than 80% "
            "of the 4.00 GiB free") in sim.strategy_reason
    assert "chunked's step on the 40-client cohort plans 1.00 GiB" in sim.strategy_reason
    # The cache keeps the timings' choice; the check runs again (free memory changes).
    monkeypatch.setattr(calibrate.memory, "available_bytes", lambda: 64 * 2**30)
    again = Simulation(cfg, dataset=small_dataset(n=1200))
    assert again.strategy == "vmap" and len(calls) == 2 and "cached" in again.strategy_reason
    # Nothing but a loop-free ranking that fits nowhere is an error naming the sizes.
    monkeypatch.setattr(calibrate.memory, "available_bytes", lambda: 1)
    monkeypatch.setattr(calibrate, "_load_cache", lambda: {})
    monkeypatch.setattr(calibrate, "measure",
                        lambda sim, candidates=calibrate.CANDIDATES, clients=None, repeats=3:
                        {c: ({"vmap": 1.0, "chunked": 1.1, "map": 1.2}.get(c, float("inf")))
                         for c in candidates})
    with pytest.raises(RuntimeError, match="no measured strategy fits the 40-client cohort"):
        Simulation(cfg, dataset=small_dataset(n=1200))


def test_a_strategy_run_on_the_whole_cohort_or_the_loop_is_not_checked(cache_dir, monkeypatch):
    monkeypatch.setattr(calibrate.memory, "cohort_step_bytes",
                        lambda sim, clients: pytest.fail("checked needlessly"))
    calls = []
    monkeypatch.setattr(calibrate, "measure", _gpu_like_measure(calls))
    # Second stage on the whole 40-client cohort: vmap ran on it, so it fits.
    cfg = small_config(**{"training.client_parallelism": "auto", "data.num_clients": 40,
                          "training.clients_per_round": 40})
    sim = Simulation(cfg, dataset=small_dataset(n=1200))
    assert sim.strategy == "vmap" and "plans" not in sim.strategy_reason


def test_the_real_memory_check_compiles_the_real_cohort(cache_dir, monkeypatch, caplog):
    cfg, _ = _forty_clients_capped_at_24(monkeypatch)
    sim = Simulation(cfg, dataset=small_dataset(n=1200))
    assert sim.strategy == "vmap"
    assert "vmap's step on the 40-client cohort plans" in sim.strategy_reason
    # The check's compiled step serves the run: round 0 compiles no cohort step.
    caplog.set_level(logging.WARNING)
    with jax.log_compiles(True):
        state, res = sim.run_round(sim.init_state(), 0)
    assert np.isfinite(res.train_loss)
    compiled = [r.getMessage() for r in caplog.records if "XLA compilation" in r.getMessage()]
    assert not [m for m in compiled if "cohort_step" in m], compiled


def test_a_step_planned_beyond_the_free_memory_is_not_timed(cache_dir, monkeypatch, capsys):
    # Out of host memory the kernel kills the process: calibration must not try.
    sim = Simulation(small_config(), dataset=small_dataset())
    ran, train = [], sim._train_cohort
    sim._train_cohort = lambda *a, **k: ran.append(sim.strategy) or train(*a, **k)
    monkeypatch.setattr(calibrate.memory, "available_bytes", lambda: 1024)
    timings = calibrate.measure(sim, clients=2, repeats=1)
    assert timings["loop"] < float("inf")  # the loop's step does not grow: not planned
    assert set(ran) == {"loop"}  # the others were planned, never run
    for name in ("vmap", "map", "chunked"):
        assert timings[name] == float("inf")
    out = capsys.readouterr().out
    assert "vmap failed (MemoryError: its 2-client step plans" in out and "not run" in out


def test_defenses_given_by_hand_are_in_the_key_and_a_configs_key_is_unchanged():
    """A choice timed without (or with other) hand-given defenses is not reused for
    them; a config run's key has no new field, so its cached choices stay valid."""
    from defenses.pruning import gc

    from fedsim.calibrate import calibration_key

    ds = small_dataset()
    plain = calibration_key(Simulation(small_config(), dataset=ds))
    assert "hand_defenses" not in plain
    hand = calibration_key(Simulation(small_config(), dataset=ds, defenses={"upload": gc(0.3)}))
    other = calibration_key(Simulation(small_config(), dataset=ds, defenses={"upload": gc(0.5)}))
    assert '"hand_defenses": {"upload": "gc(p=0.3)"}' in hand
    assert len({plain, hand, other}) == 3
