"""The rate ceilings in the read model (lua/include/ceilcensus.lua, ceiluse.lua): per scope, in the
census, `admission census`, /metrics and the live page, its limits (configured, learned,
effective), levels, reservations in flight, use over the last minute, the last header reading,
the wait of the next admit, refusals by ceiling and the reservation accuracy. On fakeredis, Redis 7
and Valkey 8 with clock = "caller", so time is exact."""
from __future__ import annotations

import json
import os
import time

import pytest

from admission import doctor
from admission.view import render_census

from helpers import T0, adm, policy
from test_rules_ceilings import MIDNIGHT, P, Ask, ceil_policy

MINUTE = T0 - T0 % 60  # T0 starts a minute already; kept explicit for the sliding-minute test


def census(a, now):
    return a.ops.census(now=now)


def scope(doc, name="key"):
    return next(c for c in doc["ceilings"] if c["scope"] == name)


def limit(c, name):
    return next(l for l in c["limits"] if l["limit"] == name)


def test_a_scope_shows_its_configured_learned_and_effective_limits(redis_client):
    a = adm(redis_client, pol=ceil_policy({"tpm": 6000, "rpm": 60, "headroom": 0.5}))
    assert Ask(a)(T0, input_tokens=1000, max_tokens=500).admitted
    c = scope(census(a, T0))
    assert c["pools"] == [P] and c["closedUntil"] == 0
    tpm = limit(c, "tpm")
    assert tpm["configured"] == 6000 and "learned" not in tpm
    assert tpm["effective"] == 3000 and tpm["capacity"] == 3000 and tpm["level"] == 1500
    assert tpm["refillPerSecond"] == pytest.approx(50)
    assert limit(c, "rpm")["effective"] == 30
    # learned from the provider's headers (ceil:<scope> learned:<limit>): the lower one wins
    redis_client.hset("adm:{t}:ceil:key", mapping={"learned:tpm": 4000, "learned:rpm": 100, "learned:tokens": 7})
    c = scope(census(a, T0))
    assert limit(c, "tpm")["learned"] == 4000 and limit(c, "tpm")["effective"] == 2000
    assert limit(c, "rpm")["learned"] == 100 and limit(c, "rpm")["effective"] == 30
    other = limit(c, "tokens")                           # a kind the policy does not name: shown too
    assert other["learned"] == 7 and "configured" not in other and "level" not in other


def test_a_learned_burst_is_no_limit_of_its_own(redis_client):
    from admission.ratelimits import Limit, Reading
    a = adm(redis_client, pol=ceil_policy({"rpm": 600}))         # ten a second, burst_s 1: ten held
    d = Ask(a)(T0)
    a.release(d.seat, now=T0, reading=Reading(T0, {"rpm": Limit("rpm", 600, 0, 0.1, 0.0)}))
    c = scope(census(a, T0 + 10))
    assert [l["limit"] for l in c["limits"]] == ["rpm"]           # the provider's burst: 0.2 s of its rate
    assert limit(c, "rpm")["capacity"] == pytest.approx(2)


def test_a_pool_without_ceilings_lists_no_scope(redis_client):
    a = adm(redis_client, pol=policy())
    doc = census(a, T0)
    assert doc["ceilings"] == [] and all("ceilingScope" not in p for p in doc["pools"])
    assert "ceilings" not in render_census(doc)


def test_the_rounds_in_flight_reservations_are_summed_per_scope(redis_client):
    a = adm(redis_client, pol=ceil_policy({"tpm": 60000}, other={"rpm": 600}))
    ask = Ask(a)
    d1 = ask(T0, input_tokens=1000, max_tokens=500)
    d2 = ask(T0, input_tokens=200, max_tokens=100)
    ask(T0, pool="n@q", input_tokens=7, max_tokens=0)
    doc = census(a, T0)
    c = scope(doc)
    assert (c["reservedRequests"], c["reservedInputTokens"], c["reservedOutputTokens"], c["reservedTokens"]) == \
        (2, 1200, 600, 1800)
    assert scope(doc, "other")["reservedRequests"] == 1 and scope(doc, "other")["reservedTokens"] == 7
    assert next(p for p in doc["pools"] if p["pool"] == P)["ceilingScope"] == "key"
    a.release(d1.seat, now=T0, usage={"input_tokens": 900, "output_tokens": 100})
    c = scope(census(a, T0))
    assert (c["reservedRequests"], c["reservedTokens"]) == (1, 300)
    a.release(d2.seat, now=T0)
    assert scope(census(a, T0))["reservedRequests"] == 0


def test_use_over_the_last_minute_slides(redis_client):
    a = adm(redis_client, pol=ceil_policy({"tpm": 60000, "output_charge": "received"}))
    ask = Ask(a)
    d = ask(MINUTE + 30, input_tokens=1000, max_tokens=1000)
    c = scope(census(a, MINUTE + 40))          # in flight: reserved, not yet counted by the provider
    assert c["usedLastMinute"] == {"requests": 0, "tokens": 0} and c["reservedTokens"] == 2000
    a.release(d.seat, now=MINUTE + 50, usage={"input_tokens": 1000, "output_tokens": 200})   # what it counted
    assert scope(census(a, MINUTE + 50))["usedLastMinute"] == {"requests": 1, "tokens": 1200}
    half = scope(census(a, MINUTE + 90))["usedLastMinute"]          # half of that minute still inside
    assert half["requests"] == pytest.approx(0.5) and half["tokens"] == pytest.approx(600)
    d = ask(MINUTE + 90, input_tokens=100, max_tokens=0)
    a.release(d.seat, now=MINUTE + 90, usage={"input_tokens": 100, "output_tokens": 0})
    both = scope(census(a, MINUTE + 90))["usedLastMinute"]
    assert both["requests"] == pytest.approx(1.5) and both["tokens"] == pytest.approx(700)
    assert scope(census(a, MINUTE + 181))["usedLastMinute"] == {"requests": 0, "tokens": 0}


def test_the_wait_is_the_next_mean_round_s_and_a_closure_s(redis_client):
    a = adm(redis_client, pol=ceil_policy({"rpm": 60, "tpm": 6000}))
    ask = Ask(a)
    assert scope(census(a, T0))["waitSeconds"] == 0
    d = ask(T0, input_tokens=5000, max_tokens=0)
    a.release(d.seat, now=T0, usage={"input_tokens": 5000, "output_tokens": 0})   # the mean: 5,000 in
    c = scope(census(a, T0 + 0.5))
    # the request bucket refills in 0.5 s, the token one lacks 3,950 at 100 a second
    assert c["waitSeconds"] == pytest.approx(39.5)
    refused = ask(T0 + 0.5)                                   # an undeclared round: the mean
    assert refused.reason == "ceiling-tpm" and refused.wait_s == pytest.approx(c["waitSeconds"])
    assert scope(census(a, T0 + 0.5))["refusals"] == {"ceiling-tpm": 1}


def test_the_wait_is_the_longest_bucket_s(redis_client):
    a = adm(redis_client, pol=ceil_policy({"rpm": 1, "tpm": 6000}))     # one request a minute
    d = Ask(a)(T0, input_tokens=5000, max_tokens=0)
    a.release(d.seat, now=T0, usage={"input_tokens": 5000, "output_tokens": 0})
    # the request bucket refills in 60 s, the token one's 4,000 short in 40 s
    assert scope(census(a, T0))["waitSeconds"] == pytest.approx(60)


def test_a_closed_scope_waits_until_midnight(redis_client):
    a = adm(redis_client, pol=ceil_policy({"rpd": 1}))
    ask = Ask(a)
    assert ask(T0).admitted
    assert not ask(T0 + 1).admitted
    c = scope(census(a, T0 + 2))
    assert c["closedUntil"] == MIDNIGHT and c["closedWhy"] == "rpd"
    assert c["waitSeconds"] == pytest.approx(MIDNIGHT - T0 - 2) and c["refusals"] == {"ceiling-rpd": 1}
    assert "CLOSED (rpd)" in render_census(census(a, T0 + 2))


def test_a_held_bucket_and_the_last_header_reading(redis_client):
    a = adm(redis_client, pol=ceil_policy({"rpm": 600, "burst_s": 10}))
    d = Ask(a)(T0)
    a.release(d.seat, outcome="ceiling", ceiling="rpm", reset_s=30, now=T0)
    c = scope(census(a, T0 + 1))
    assert limit(c, "rpm")["heldUntil"] == T0 + 30 and "reading" not in c
    redis_client.hset("adm:{t}:ceil:key", mapping={"readAt": T0 - 4, "remaining:rpm": 12})
    c = scope(census(a, T0 + 1))
    assert c["reading"] == {"at": T0 - 4, "ageSeconds": 5, "remaining": {"rpm": 12}}
    assert "heldUntil" not in limit(scope(census(a, T0 + 31)), "rpm")


def test_reservation_accuracy_is_the_median_and_p95_of_counted_over_reserved(redis_client):
    a = adm(redis_client, pol=ceil_policy({"tpm": 10 ** 7, "output_charge": "received"}))
    ask = Ask(a)
    assert "accuracy" not in scope(census(a, T0))
    for i, counted in enumerate([1000] * 9 + [2000]):                 # reserved 1,000 each
        d = ask(T0, input_tokens=500, max_tokens=500)
        a.release(d.seat, now=T0, usage={"input_tokens": counted // 2, "output_tokens": counted // 2})
    acc = scope(census(a, T0))["accuracy"]
    assert acc == {"samples": 10, "median": 1, "p95": 2}
    d = ask(T0, input_tokens=500, max_tokens=500)
    a.release(d.seat, now=T0)                                           # no usage: no sample
    d = ask(T0)                                                         # reserved the mean: a sample
    a.release(d.seat, now=T0, usage={"input_tokens": 0, "output_tokens": 0})
    assert scope(census(a, T0))["accuracy"]["samples"] == 11
    text = render_census(census(a, T0))
    assert "counted/reserved median 1.00 p95 2.00 (n 11)" in text


def test_the_accuracy_histogram_stays_bounded(redis_client):
    a = adm(redis_client, pol=ceil_policy({"tpm": 10 ** 7, "output_charge": "received"}))
    redis_client.hset("adm:{t}:ceiluse:key", mapping={"acc:0": 990, "acc:8": 9, "accN": 999})
    d = Ask(a)(T0, input_tokens=100, max_tokens=0)
    a.release(d.seat, now=T0, usage={"input_tokens": 100, "output_tokens": 0})
    state = redis_client.hgetall("adm:{t}:ceiluse:key")
    assert (float(state[b"acc:0"]), float(state[b"acc:8"]), float(state[b"accN"])) == (495, 4, 499)
    assert scope(census(a, T0))["accuracy"]["samples"] == 499


def test_the_census_line_per_scope(redis_client):
    a = adm(redis_client, pol=ceil_policy({"tpm": 6000, "rpm": 60}))
    ask = Ask(a)
    ask(T0, input_tokens=1000, max_tokens=500)
    ask(T0, input_tokens=1000, max_tokens=500)                        # refused on rpm
    line = next(l for l in render_census(census(a, T0)).splitlines() if l.startswith("ceilings"))
    assert line == ("ceilings key (m@p): rpm 0/60 (configured 60), tpm 4500/6000 (configured 6000); "
                    "in flight 1 req 1500 tok; last minute 0 req 0 tok; next in 1.0s; refused rpm 1")


def test_the_doctor_checks_the_read_model_counts(redis_client):
    a = adm(redis_client, pol=ceil_policy({"tpm": 6000}))
    d = Ask(a)(T0, input_tokens=10, max_tokens=10)
    a.release(d.seat, now=T0, usage={"input_tokens": 10, "output_tokens": 10})
    assert doctor.check(redis_client, "t").ok
    redis_client.hset("adm:{t}:ceiluse:key", mapping={"useTok": "x", "acc:3": "-1"})
    found = {(p["kind"], p["key"], p["field"]) for p in doctor.check(redis_client, "t").problems}
    assert found == {("not-a-number", "ceiluse:key", "useTok"), ("not-a-number", "ceiluse:key", "acc:3")}
    redis_client.hdel("adm:{t}:ceiluse:key", "useTok", "acc:3")


def test_the_admit_reads_no_read_model_field(redis_client):
    # the use and the accuracy live in ceiluse:<scope>, written at a round's end: the admit reads
    # the buckets' hash alone, and a hash from before that split loses its old fields at a round's end
    a = adm(redis_client, pol=ceil_policy({"tpm": 60000}))
    d = Ask(a)(T0, input_tokens=100, max_tokens=100)
    assert not redis_client.exists("adm:{t}:ceiluse:key")
    redis_client.hset("adm:{t}:ceil:key", mapping={"useMin": "1", "useReq": "9", "accN": "3", "acc:2": "3"})
    a.release(d.seat, now=T0, usage={"input_tokens": 100, "output_tokens": 100})
    fields = set(redis_client.hkeys("adm:{t}:ceil:key"))
    assert not fields & {b"useMin", b"useReq", b"accN", b"acc:2"} and b"tpm" in fields
    assert redis_client.hget("adm:{t}:ceiluse:key", "useReq") == b"1"


# -- the CLI, /metrics and the page -------------------------------------------------------------


def test_admission_census_prints_a_line_per_scope(server_url):
    import redis

    from test_cli import run
    client = redis.Redis.from_url(server_url)
    try:
        a = adm(client, mesh="cli", pol=ceil_policy({"tpm": 6000}))
        Ask(a)(T0, input_tokens=100, max_tokens=100)
        out = run("census", "--url", server_url, "--mesh", "cli")
        assert out.returncode == 0, out.stderr
        assert "ceilings key (m@p): tpm " in out.stdout and "in flight 1 req 200 tok" in out.stdout
        doc = json.loads(run("census", "--json", "--url", server_url, "--mesh", "cli").stdout)
        assert doc["ceilings"][0]["scope"] == "key"
    finally:
        client.close()


def test_metrics_show_each_scope(redis_client):
    pytest.importorskip("prometheus_client")
    from test_serve import get, samples, serving, value
    a = adm(redis_client, pol=ceil_policy({"tpm": 6000, "rpm": 60, "headroom": 0.5}))
    ask = Ask(a)
    d = ask(T0, input_tokens=1000, max_tokens=500)
    ask(T0, input_tokens=1000, max_tokens=500)                          # refused on rpm
    redis_client.hset("adm:{t}:ceil:key", mapping={"learned:tpm": 4000, "net:tpm": 10, "netAt": T0})
    with serving(redis_client) as (base, _srv):
        found = samples(get(base + "/metrics")[2])
        doc = json.loads(get(base + "/census.json")[2])
        c = scope(doc)
        s = {"mesh": "t", "scope": "key"}
        assert value(found, "admission_ceiling_limit", limit="tpm", source="configured", **s) == 6000
        assert value(found, "admission_ceiling_limit", limit="tpm", source="learned", **s) == 4000
        assert value(found, "admission_ceiling_limit", limit="tpm", source="effective", **s) == 2000
        assert value(found, "admission_ceiling_level", limit="tpm", **s) == limit(c, "tpm")["level"]
        assert value(found, "admission_ceiling_capacity", limit="rpm", **s) == 1
        assert value(found, "admission_ceiling_held", limit="rpm", **s) == 0
        assert value(found, "admission_ceiling_outside_per_second", limit="tpm", **s) == 10   # learned drain
        assert value(found, "admission_ceiling_outside_per_second", limit="rpm", **s) == 0
        assert value(found, "admission_ceiling_reserved", unit="requests", **s) == 1
        assert value(found, "admission_ceiling_reserved", unit="tokens", **s) == 1500
        assert value(found, "admission_ceiling_used_last_minute", unit="tokens", **s) == \
            pytest.approx(c["usedLastMinute"]["tokens"])
        assert value(found, "admission_ceiling_wait_seconds", **s) == pytest.approx(c["waitSeconds"])
        assert value(found, "admission_ceiling_closed", **s) == 0
        assert value(found, "admission_ceiling_refusals_total", ceiling="rpm", **s) == 1
        assert "admission_ceiling_reading_age_seconds" not in found
        assert "admission_ceiling_reservation_accuracy" not in found
        a.release(d.seat, now=T0, usage={"input_tokens": 1000, "output_tokens": 500})
        redis_client.hset("adm:{t}:ceil:key", mapping={"readAt": time.time() - 100})  # the server's clock
        found = samples(get(base + "/metrics")[2])
        assert value(found, "admission_ceiling_reservation_accuracy", quantile="0.5", **s) == 1
        assert value(found, "admission_ceiling_reservation_accuracy", quantile="0.95", **s) == 1
        assert value(found, "admission_ceiling_reservation_samples", **s) == 1
        assert 99 <= value(found, "admission_ceiling_reading_age_seconds", **s) < 160


def test_the_page_renders_the_ceilings_table(redis_client):
    pytest.importorskip("prometheus_client")
    from test_serve import Dom, get, serving
    a = adm(redis_client, pol=ceil_policy({"tpm": 6000, "rpm": 60}))
    Ask(a)(T0, input_tokens=1000, max_tokens=500)
    with serving(redis_client) as (base, _srv):
        dom = Dom(get(base + "/")[2])
        table = dom.one("table", id="ceilings")
        row = dom.one("tr", within=table, data_scope="key", data_limit="tpm")
        assert "6000 / –" in row["text"] and "4500 of 6000" in row["text"]
        assert dom.one("tr", within=table, data_scope="key", data_limit="rpm")["attrs"].get("class") is None
    a2 = adm(redis_client, mesh="u", pol=policy())
    with serving(redis_client, meshes=("u",)) as (base, _srv):
        assert "no rate ceilings" in get(base + "/?mesh=u")[2]
    del a2


CHROMIUM = "/usr/bin/chromium"


@pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK), reason=f"{CHROMIUM} not installed")
def test_the_live_page_in_chromium_shows_the_ceilings(redis_client, tmp_path):
    pytest.importorskip("prometheus_client")
    from test_serve import Dom, chromium, serving
    a = adm(redis_client, pol=ceil_policy({"rpm": 60}))
    d = Ask(a)(T0)
    a.release(d.seat, outcome="ceiling", ceiling="rpm", reset_s=30, now=T0)
    with serving(redis_client) as (base, _srv):
        run = chromium(base + "/", tmp_path, "--dump-dom")
        assert run.returncode == 0, run.stderr[-2000:]
        dom = Dom(run.stdout)
        table = dom.one("table", id="ceilings")
        assert table["attrs"]["data-source"] == "script"          # the script refreshed it
        row = dom.one("tr", within=table, data_scope="key", data_limit="rpm")
        assert "m@p" in row["text"] and "60 / –" in row["text"]
