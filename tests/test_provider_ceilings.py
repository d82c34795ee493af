"""The providers' rate ceilings in the provider model (admission/tools/sim/ceilings.py), on their
own: continuous buckets, UTC-day allowances, the two counting styles, outside traffic, the 429
words that admission.ratelimits reads back."""
from __future__ import annotations

import math

import pytest

from admission import ratelimits
from admission.tools.sim import ceilings as cm
from admission.tools.sim.ceilings import Bucket, KeyCeilings, Prompt, check_config, split_prompt

T0 = 1_764_720_000.0  # 2025-12-03T00:00:00Z: a UTC midnight
P1K = Prompt(1000)


def keyed(now: float = T0, **settings) -> KeyCeilings:
    limits = {k: settings.pop(k) for k in list(settings) if k in cm.KINDS}
    return KeyCeilings(check_config(limits, **settings), now)


# -- one bucket ------------------------------------------------------------------------------------


def test_a_minute_bucket_refills_continuously_at_its_rate_up_to_its_capacity():
    b = Bucket("tpm", 6000, T0)
    assert b.level == 6000 and b.wait(6000, T0) == 0
    b.take(6000, T0)
    b.advance(T0 + 1)
    assert b.level == pytest.approx(100)          # 6,000 / 60 per second, no fixed window
    assert b.wait(1000, T0 + 1) == pytest.approx(9.0)
    assert b.reset_s(T0 + 1) == pytest.approx(59.0)
    b.advance(T0 + 600)
    assert b.level == 6000                        # never above its capacity
    assert b.wait(6001, T0 + 600) == math.inf     # more than it holds: never


def test_the_request_bucket_holds_burst_seconds_of_its_rate_and_at_least_one_request():
    b = Bucket("rpm", 60, T0, burst_s=1.0)        # "60 RPM may be enforced as 1 request per second"
    assert b.capacity == 1 and b.wait(1, T0) == 0
    b.take(1, T0)
    assert b.wait(1, T0 + 0.5) == pytest.approx(0.5)
    assert b.wait(1, T0 + 1.0) == 0
    assert Bucket("rpm", 50, T0, burst_s=1.0).capacity == 1  # 0.83 s of rate is still one request
    assert Bucket("rpm", 50, T0).capacity == 50


def test_a_day_allowance_runs_out_until_utc_midnight_and_then_is_full():
    b = Bucket("rpd", 3, T0 + 3600)
    for _ in range(3):
        assert b.wait(1, T0 + 3600) == 0
        b.take(1, T0 + 3600)
    assert b.wait(1, T0 + 7200) == pytest.approx(cm.DAY - 7200)  # no refill within the day
    assert b.reset_s(T0 + 7200) == pytest.approx(cm.DAY - 7200)
    assert b.wait(1, T0 + cm.DAY) == 0 and b.level == 3


def test_outside_traffic_drains_the_bucket_continuously():
    b = Bucket("tpm", 6000, T0, drain=1800)       # 30 % of the key spent outside the mesh
    b.take(6000, T0)
    b.advance(T0 + 10)
    assert b.level == pytest.approx((6000 - 1800) / 60 * 10)
    assert b.wait(4200, T0 + 10) == pytest.approx(50.0)
    d = Bucket("tpd", 1440, T0, drain=1)          # one token a minute all day
    d.advance(T0 + 3600)
    assert d.level == pytest.approx(1380)


def test_a_lowered_limit_is_in_force_at_once():
    b = Bucket("tpm", 100_000, T0)
    b.take(20_000, T0)
    b.reconfigure(50_000, 60, 0, T0)
    assert b.level == 50_000 and b.wait(50_001, T0) == math.inf
    b.advance(T0 + 60)
    assert b.level == 50_000
    b.reconfigure(100_000, 60, 0, T0 + 60)       # a raised one refills at its new rate
    b.advance(T0 + 90)
    assert b.level == pytest.approx(100_000)


# -- the counting styles --------------------------------------------------------------------------


def test_openai_counts_prompt_plus_max_tokens_on_arrival_and_nothing_at_completion():
    assert cm.on_arrival("openai", Prompt(1000, cache_read=700), 1024) == {
        "rpm": 1, "rpd": 1, "tpm": 2024, "tpd": 2024, "itpm": 1000, "otpm": 1024}
    assert cm.on_completion("openai", 50) == {}
    k = keyed(rpm=60, tpm=10_000)
    assert k.admit(P1K, 5000, T0) is None
    assert k.buckets["tpm"].level == 4000 and k.buckets["rpm"].level == 59
    k.complete(50, T0)
    assert k.buckets["tpm"].level == 4000 and k.used["tpm"].total == 6000


def test_anthropic_counts_input_without_cache_reads_and_output_when_produced():
    prompt = split_prompt(10_000, read_share=0.7, write_share=0.1)
    assert (prompt.cache_read, prompt.cache_creation, prompt.uncached) == (7000, 1000, 2000)
    assert cm.on_arrival("anthropic", prompt, 4096) == {"rpm": 1, "rpd": 1, "itpm": 3000, "tpm": 3000,
                                                         "tpd": 3000, "otpm": 0}
    k = keyed(rpm=50, itpm=30_000, otpm=1000, style="anthropic")
    assert k.admit(prompt, 4096, T0) is None
    assert k.buckets["itpm"].level == 27_000 and k.buckets["otpm"].level == 1000  # max_tokens not counted
    k.complete(3000, T0)                          # the output, counted as produced: a debt of 2,000
    assert k.buckets["otpm"].level == -2000 and k.used["otpm"].total == 3000
    refusal = k.admit(Prompt(10), 10, T0 + 1)
    assert refusal is not None and refusal.kind == "otpm"
    assert refusal.wait_s == pytest.approx((2000 - 1000 / 60 + 1) / (1000 / 60))  # until one token is back
    assert k.state(T0 + 1)["otpm"]["remaining"] == 0


def test_a_refused_request_counts_nothing_and_names_the_ceiling_that_waits_longest():
    k = keyed(rpm=2, tpm=10_000, rpd=1000)
    assert k.admit(P1K, 5000, T0) is None
    before = {kind: b.level for kind, b in k.buckets.items()}
    refusal = k.admit(P1K, 5000, T0)              # 6,000 of 4,000 tokens; the requests would fit
    assert refusal is not None and refusal.kind == "tpm" and refusal.requested == 6000
    assert refusal.used == 6000 and refusal.limit == 10_000
    assert refusal.wait_s == pytest.approx(2000 / (10_000 / 60))
    assert {kind: b.level for kind, b in k.buckets.items()} == before
    assert k.refused == {"rpm": 0, "tpm": 1, "rpd": 0} and k.used["rpm"].total == 1
    assert k.admit(Prompt(10), 10, T0) is None
    refusal = k.admit(P1K, 5000, T0)              # both short: tokens for 12 s, requests for 30 s
    assert refusal.kind == "rpm" and refusal.wait_s == pytest.approx(30.0)
    assert k.buckets["tpm"].wait(6000, T0) == pytest.approx((6000 - 3980) / (10_000 / 60))


def test_the_use_is_tallied_per_minute_from_the_origin():
    k = KeyCeilings(check_config({"tpm": 100_000}), T0 + 130, origin=T0)
    k.admit(P1K, 0, T0 + 130)
    k.admit(P1K, 1000, T0 + 179)
    k.admit(P1K, 0, T0 + 185)
    assert k.used["tpm"].per_minute == [0, 0, 3000, 1000] and k.used["tpm"].total == 4000


def test_state_says_limit_remaining_and_the_time_until_full():
    k = keyed(rpm=60, tpm=6000, rpd=100)
    k.admit(P1K, 2000, T0 + 10)
    st = k.state(T0 + 10)
    assert st["tpm"] == {"limit": 6000, "remaining": 3000, "reset_s": pytest.approx(30.0)}
    assert st["rpm"] == {"limit": 60, "remaining": 59, "reset_s": pytest.approx(1.0)}
    assert st["rpd"] == {"limit": 100, "remaining": 99, "reset_s": pytest.approx(cm.DAY - 10)}


def test_reconfigure_adds_removes_and_lowers_ceilings_in_place():
    k = keyed(tpm=100_000)
    k.admit(P1K, 1000, T0)
    k.reconfigure(check_config({"tpm": 50_000, "rpm": 10}), T0)
    assert set(k.buckets) == {"rpm", "tpm"} and k.buckets["tpm"].level == 50_000
    assert k.used["tpm"].total == 2000
    k.reconfigure(check_config({"rpm": 10}), T0)
    assert set(k.buckets) == {"rpm"}


# -- settings and words ------------------------------------------------------------------------------


def test_bad_settings_are_refused_all_at_once():
    with pytest.raises(ValueError) as exc:
        check_config({"tpm": -1, "rpm": math.nan, "xpm": 3, "rpd": "many"}, style="azure",
                     outside={"tpm": -5, "bytes": 1}, rpm_burst_s=0)
    text = str(exc.value)
    for word in ("tpm must be", "rpm must be", "unknown ceiling 'xpm'", "rpd must be a number", "style",
                 "outside tpm", "unknown outside traffic 'bytes'", "rpm burst"):
        assert word in text
    with pytest.raises(ValueError, match="below the tpm limit"):
        check_config({"tpm": 1000}, outside={"tpm": 1000})
    with pytest.raises(ValueError, match="below the itpm limit"):
        check_config({"itpm": 1000}, outside={"tpm": 2000})
    cfg = check_config({"tpm": 1000, "rpm": None}, outside={"tpm": 0, "rpm": 0})
    assert cfg.limits == {"tpm": 1000} and cfg.outside == {} and not check_config().active


@pytest.mark.parametrize("kind", cm.KINDS)
@pytest.mark.parametrize("style", cm.STYLES)
def test_the_429_words_name_their_ceiling_to_the_header_reader(kind, style):
    refusal = cm.Refusal(kind, 100_000, 99_000, 3024, 1.5)
    text = cm.refusal_message(style, refusal, "gpt-x")
    assert ratelimits.spent_ceiling(429, None, text) == kind
    if style == "openai":
        assert text.startswith("Rate limit reached for gpt-x") and "Limit 100000, Used 99000, Requested 3024" in text
        assert "try again in 1.500s" in text
        too_large = cm.refusal_message(style, cm.Refusal(kind, 100, 0, 3024, math.inf), "gpt-x")
        assert too_large.startswith("Request too large") and ratelimits.spent_ceiling(429, None, too_large) == kind
    else:
        assert text.startswith("This request would exceed your organization's rate limit of 100,000 ")
