"""admission.sim: the provider model, reproducibility, and the seed's relations on the shipped
Lua (docs/simulation.md). Runs are seeded, so every figure here is exact and the relations are
not flaky: a failing relation means the code (simulator or admission) changed what it does.

Where a relation of the seed does not hold on this model the test asserts what does hold, and
the docs say why (see "Where we differ from the seed" in docs/simulation.md)."""
from __future__ import annotations

import dataclasses
import json
import math

import pytest

from admission.servers import find_server
from admission.sim import cli, load, model, scenarios
from admission.sim.policies import LANES
from admission.sim.runner import Backend, Job, rng_for, run_job, simulate

K = 18.0
ENGINE = next((e for e in ("redis", "valkey") if find_server(e)), None)
needs_server = pytest.mark.skipif(ENGINE is None, reason="needs redis-server or valkey-server")


@pytest.fixture(scope="module")
def backend():
    b = Backend(ENGINE)
    yield b
    b.close()


def runs(backend, scenario: str, policy: str, n: int, *, hours: float = 10.0) -> list[dict]:
    return [run_job(Job(scenario, policy, r, 1, K, hours), backend)[1] for r in range(n)]


def mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs)


# -- the provider model -----------------------------------------------------------------------
def test_provider_rates_match_the_seed():
    assert model.rate(1, K) == pytest.approx(61.0)
    assert 38 < model.rate(5, K) < 45      # the seed: "about 39 at five"
    assert 19 < model.rate(20, K) < 22     # "about 20 at twenty"
    assert model.max_rounds_at_rate(model.rate(7, K), K) == pytest.approx(7)
    assert model.p_rate_limited(18, K) == 0
    assert model.p_rate_limited(19, K) == pytest.approx(0.1)
    assert model.p_rate_limited(40, K) == 0.9


def test_processor_sharing():
    pool = model.ProviderPool("p@sim", K)
    pool.add("a", 1000, 0.0)
    pool.add("b", 2000, 0.0)
    r2 = model.rate(2, K)
    assert pool.next_finish() == pytest.approx(1000 / r2)
    assert pool.pop_finished(1000 / r2) == ["a"]
    # b has 1000 left, now alone at 61 tokens/s
    assert pool.next_finish() == pytest.approx(1000 / r2 + 1000 / 61)
    assert pool.remove("b", 1000 / r2 + 500 / 61) == pytest.approx(500)
    assert pool.next_finish() is None


def test_load_sizes_are_in_one_place():
    s = load.sizes()
    assert s["review_heads"] == 35 and s["review_tokens"] == 40_000
    assert s["bug_backlog"] == 100 and s["bug_tokens"] == 20_000
    items = load.measured_load(rng_for(1, "burst", 0), "main@sim")
    lanes = {l: sum(1 for i in items if i.lane == l) for l in ("reviews", "bugfix", "triage", "babysitter")}
    assert lanes == {"reviews": 35, "bugfix": 103, "triage": 15, "babysitter": 10}
    assert all(0 <= i.arrival < 120 for i in items if i.lane == "reviews")
    assert sorted(i.arrival for i in items if i.meta.get("red_main")) == [300.0] * 3


# -- reproducibility ---------------------------------------------------------------------------
def _same(a: dict, b: dict) -> bool:
    a, b = dict(a), dict(b)
    a.pop("wall_seconds"), b.pop("wall_seconds")
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


@needs_server
def test_a_run_is_reproducible_exactly(backend):
    first = run_job(Job("idle", "seed-and-grow", 3), backend)[1]
    again = run_job(Job("idle", "seed-and-grow", 3), backend)[1]
    other = run_job(Job("idle", "seed-and-grow", 3, seed=2), backend)[1]
    assert _same(first, again)
    assert not _same(first, other)
    if find_server("valkey") and ENGINE != "valkey":  # the same figures on the other engine
        valkey = Backend("valkey")
        try:
            assert _same(first, run_job(Job("idle", "seed-and-grow", 3), valkey)[1])
        finally:
            valkey.close()
    assert _same(run_job(Job("burst", "step", 0))[1], run_job(Job("burst", "step", 0))[1])


# -- burst --------------------------------------------------------------------------------------
@needs_server
def test_burst(backend):
    step = runs(backend, "burst", "step", 3)
    sng = runs(backend, "burst", "seed-and-grow", 3)
    oracle = runs(backend, "burst", "oracle", 1)[0]
    # step floods the pool: hundreds of 429s, rounds far above K
    assert all(f["rate_limited"] >= 100 for f in step)
    assert all(f["peak_in_flight"]["main@sim"] > K + 10 for f in step)
    # seed-and-grow drains, with a handful of 429s, faster than step in every lane
    assert all(f["drained"] for f in sng)
    # "a handful" against step's hundreds: under a fifth of step's in every run (mostly the
    # upward probing that the bug pool's waiter drives, see docs/simulation.md)
    assert all(s["rate_limited"] * 5 < t["rate_limited"] for s, t in zip(sng, step))
    for lane in ("reviews", "bugfix", "triage", "babysitter"):
        assert mean(f["drain_minutes"][lane] for f in sng) < mean(
            f["drain_minutes"][lane] or math.inf for f in step), lane
    # ...and starts the red mains sooner than step (not "within minutes": docs/simulation.md)
    assert all(s["red_main_start_minutes"] < t["red_main_start_minutes"] for s, t in zip(sng, step))
    # the seed: step "does not drain within ten simulated hours". On this model it does, late:
    # assert only that it takes longer than seed-and-grow (checked above) and over 3 hours.
    assert all(f["sim_minutes"] > 180 for f in step)
    # the oracle is the floor for refusals, cuts and the time until everything drained
    assert oracle["rate_limited"] == oracle["cut"] == 0
    assert oracle["peak_in_flight"]["main@sim"] <= K
    assert oracle["sim_minutes"] < min(f["sim_minutes"] for f in sng)
    assert oracle["tokens_per_s"] > max(f["tokens_per_s"] for f in sng)


# -- idle ---------------------------------------------------------------------------------------
@needs_server
def test_idle_remembered_pool_at_once_never_measured_within_a_minute(backend):
    step = runs(backend, "idle", "step", 1)[0]
    sng = runs(backend, "idle", "seed-and-grow", 2)
    assert step["start_minutes"] == {"remembered": 0.0, "never-measured": 0.0}
    for f in sng:
        # remembered: as fast as step, up to one re-ask of a refused draw (the 15 s clock)
        assert f["start_minutes"]["remembered"] <= 0.25
        # never measured: slow start 2 -> 4 -> 8 -> 16, about a minute of ramp (at most two)
        assert 0.25 < f["start_minutes"]["never-measured"] <= 2.0
        assert f["rate_limited"] == f["cut"] == 0


# -- isolation ----------------------------------------------------------------------------------
def _reviews_alone() -> scenarios.Scenario:
    sc = scenarios.make("isolation", K)
    return dataclasses.replace(sc, build=lambda rng: load.reviews(rng, "reviews@sim"))


@needs_server
def test_isolation_bug_flood_does_not_hold_back_reviews(backend):
    alone = _reviews_alone()
    sng = runs(backend, "isolation", "seed-and-grow", 2)
    sng_alone = [simulate(alone, "seed-and-grow", rng_for(1, "isolation", r), backend=backend).figures()
                 for r in range(2)]
    step = runs(backend, "isolation", "step", 1)[0]
    step_alone = simulate(alone, "step", rng_for(1, "isolation", 0)).figures()
    # seed-and-grow: the reviews drain as if the flood on the small pool were not there
    assert mean(f["drain_minutes"]["reviews"] for f in sng) <= 1.2 * mean(
        f["drain_minutes"]["reviews"] for f in sng_alone)
    # step's one bound holds them behind the flood: not drained within the horizon
    assert step["drain_minutes"]["reviews"] is None and step_alone["drain_minutes"]["reviews"] is not None
    # the seed's "28 against 81 minutes": the reviews drain faster under seed-and-grow than step
    assert all(f["drain_minutes"]["reviews"] < 600 for f in sng)
    # the flood itself: step overloads the small pool and never drains it on this model (the seed
    # saw step drain it faster); seed-and-grow drains it within minutes of the oracle
    oracle = runs(backend, "isolation", "oracle", 1)[0]
    assert step["drain_minutes"]["bugfix"] is None
    assert all(f["drain_minutes"]["bugfix"] <= 1.1 * oracle["drain_minutes"]["bugfix"] for f in sng)


# -- multipod -----------------------------------------------------------------------------------
@needs_server
def test_multipod_shared_mesh_stays_within_the_estimate(backend):
    private = runs(backend, "multipod", "seed-and-grow-private", 1)[0]
    shared = runs(backend, "multipod", "seed-and-grow", 1)[0]
    pool = "main@sim"
    # one shared estimate: rounds in flight stay within it (up to the overdraft of lanes below
    # their floor while the pool is never measured: at most one per lane)
    assert shared["peak_over_estimate"][pool] <= len(LANES)
    # four private estimates: together they put far more in flight than any one of them allows,
    # overshoot K, and pay in 429s
    assert private["peak_over_estimate"][pool] >= 10
    assert private["peak_in_flight"][pool] > K
    assert private["rate_limited"] > shared["rate_limited"]
    assert shared["drain_minutes"]["reviews"] < private["drain_minutes"]["reviews"]


# -- the CLI ------------------------------------------------------------------------------------
@needs_server
def test_cli_writes_table_json_and_plots(tmp_path, capsys):
    out = tmp_path / "sim.json"
    rc = cli.main(["--scenario", "idle", "--runs", "1", "--json", str(out), "--plots", str(tmp_path / "png"),
                   "--workers", "1", "--no-progress", "--engine", ENGINE])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "idle" in printed and "seed-and-grow" in printed and "oracle" in printed
    doc = json.loads(out.read_text())
    mean_ = doc["scenarios"]["idle"]["policies"]["seed-and-grow"]["mean"]
    for name in ("drain_minutes", "rate_limited", "cut", "red_main_start_minutes", "peak_in_flight", "tokens_per_s"):
        assert name in mean_
    assert set(mean_["drain_minutes"]) == {"remembered", "never-measured"}
    pytest.importorskip("matplotlib")
    assert (tmp_path / "png" / "idle.png").stat().st_size > 1000


def test_cli_rejects_bad_arguments(capsys):
    assert cli.main(["--runs", "0", "--no-progress"]) == 2
    with pytest.raises(SystemExit):
        cli.main(["--scenario", "nope"])
