"""``admission bench --provider --case ceilings``: the same fake provider key with rate ceilings,
the same workload, one contender after another (docs/benchmark.md, "The ceilings case").

Per key (``ceilings_settings.KEYS``: OpenAI style 60 RPM / 100k TPM; Anthropic style 50 RPM /
30k ITPM / 8k OTPM with 70 % cache reads; the OpenAI key 30 % spent from outside the mesh) and
per contender, a fresh fake provider (no concurrency limit to speak of: every 429 is a ceiling's)
and an empty Redis; ``pods`` pod processes of ``workers`` threads each call it for ``minutes``
provider minutes (``scale`` provider seconds per real second), every thread one call after
another, each call a prompt of 1k-3k tokens with ``max_tokens`` 1,024 (the fake provider answers
the whole budget). The run starts on a provider minute, so the provider's per-minute counts are
the run's minutes.

Per contender, from the provider's own ``/stats``: its 429s per ceiling, the share of each
per-minute limit (less the outside traffic) the mesh's requests counted in minutes 2 to the end,
the binding one (the most used), and the calls that succeeded.

The time scale, and what it changes: the admission runs on Redis' real clock, so its ceilings are
the key's per real minute (limit × scale) and its request bucket's burst one provider second (the
LiteLLM Router's ``rpm``/``tpm`` are per real minute too);
a token bucket then holds one real minute, ``scale`` provider minutes. So that it starts as the
provider's does, the parent sets the admission's token buckets to one provider minute just
before the start (after that the workload keeps them from filling: demand is above every limit).
"""
from __future__ import annotations

import dataclasses
import math
import threading
import time
from typing import Any

from ...core import mesh_key
from ..logs import quiet_logs
from ..servers import LocalServer
from ..sim import ceilings as C
from ..tables import table
from .ceilings_pods import CEILING_MESH, CeilingPods
from .ceilings_settings import (ALT_MODEL, KEYS, LABELS, MAX_TOKENS, SCOPE, WARMUP_MINUTES, WARMUP_MODEL,
                                CeilingSettings, Key,
                                admission_policy, effective_limits)
from .settings import MODEL, POOL

#: the fake provider's capacity K: far above any concurrency this workload reaches
NO_CONCURRENCY_LIMIT = 10_000
HEADROOM = 0.97  # the policy's default


def _prepare(contender: str, key: Key, s: CeilingSettings, redis_url: str) -> None:
    import redis

    from ...client import Admission

    r = redis.Redis.from_url(redis_url)
    try:
        r.flushall()
        if contender in ("admission", "ceilings", "headers"):
            adm = Admission(r, mesh=CEILING_MESH, pod="bench-parent", background=False)
            adm.ops.apply_policy(admission_policy(key, s, contender), recovery_hold=False)
    finally:
        r.close()


def _one_provider_minute(key: Key, redis_url: str) -> None:
    """The admission's token buckets hold one provider minute at the start (see the docstring)."""
    import redis

    r = redis.Redis.from_url(redis_url)
    try:
        sec, usec = r.time()
        now = sec + usec / 1e6
        fields: dict[str, Any] = {"at": repr(now), "day": str(math.floor(now / C.DAY))}
        for kind, limit in key.limits.items():
            if kind in C.MINUTE_KINDS and kind not in C.REQUEST_KINDS:
                fields[kind] = repr(limit * HEADROOM)
        r.hset(mesh_key(CEILING_MESH, "ceil", SCOPE), mapping=fields)
    finally:
        r.close()


def _closed(redis_url: str) -> str | None:
    """Why the key's scope is closed at the run's end (a daily ceiling spent: rpd or tpd), or None."""
    import redis

    r = redis.Redis.from_url(redis_url)
    try:
        until, why = r.hmget(mesh_key(CEILING_MESH, "ceil", SCOPE), "closedUntil", "why")
    finally:
        r.close()
    return why.decode() if until and float(until) > time.time() and why else None


def _on_a_minute(provider: Any, scale: float) -> int:
    """Sleep until the provider's next minute starts; its index."""
    sim = provider.provider.sim()
    minute = math.floor(sim / C.MINUTE) + 1
    time.sleep(max(0.0, (minute * C.MINUTE - sim) / scale))
    return minute


def _used_pct(c: dict[str, Any], key: Key, m0: int, window: range) -> dict[str, float | None]:
    """Per per-minute limit, the share the provider counted of what the mesh could have in the
    run's minutes ``window`` (offsets from the run's first minute ``m0``)."""
    used: dict[str, float | None] = {}
    for kind in effective_limits(key):
        minutes = c["used"].get(kind, {}).get("per_minute", [])
        counted = sum(minutes[m0 + m] for m in window if m0 + m < len(minutes))
        could = sum(effective_limits(key, m)[kind] for m in window)
        used[kind] = round(100.0 * counted / could, 1) if len(window) and could > 0 else None
    return used


def _row(contender: str, key: Key, s: CeilingSettings, stats: dict[str, Any], m0: int,
         reports: list[dict[str, Any]], at_change: dict[str, Any] | None = None,
         closed: str | None = None) -> dict[str, Any]:
    c = stats["ceilings"]
    used_pct = _used_pct(c, key, m0, range(WARMUP_MINUTES, math.floor(s.minutes)))
    shares = {k: v for k, v in used_pct.items() if v is not None}
    binding = max(shares, key=shares.get) if shares else None
    total = stats["total"]
    extra: dict[str, Any] = {}
    if at_change is not None:  # a lowered or killed key: what came after the change
        before = at_change["ceilings"]["429"]
        extra = {"after_change_429_by": {k: int(v) - int(before.get(k, 0)) for k, v in c["429"].items()},
                 "after_change_used_pct": _used_pct(c, key, m0, range(key.change_minute + 1, math.floor(s.minutes)))}
    if key.alternative:  # where the rounds ran: the key's model until its day was spent, then the alternative
        extra["completions_by_model"] = {m: int(stats["models"].get(m, {}).get("completions", 0))
                                         for m in (MODEL, ALT_MODEL)}
        extra["closed"] = closed
    return {**extra, "key": key.name, "contender": contender, "label": LABELS[contender],
            "provider_429": int(total.get("429", 0)),
            "provider_429_by": {k: int(v) for k, v in c["429"].items()},
            "used_pct": used_pct, "binding": binding,
            "binding_used_pct": shares.get(binding) if binding else None,
            "rounds": int(total.get("completions", 0))
            - int(stats["models"].get(WARMUP_MODEL, {}).get("completions", 0)),
            "client_done": sum(r["done"] for r in reports)}


def run(s: CeilingSettings, progress: bool = False) -> dict[str, Any]:
    """Every key, every contender; the figures (what --json prints)."""
    from ..fake_provider import FakeProviderServer
    import sys

    if s.minutes < WARMUP_MINUTES + 1:
        raise ValueError(f"minutes must be at least {WARMUP_MINUTES + 1} (the window starts at minute "
                         f"{WARMUP_MINUTES})")
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    with quiet_logs(library=False), LocalServer(s.engine) as server:
        pods = CeilingPods(s.pods)
        try:
            for name in s.keys:
                key = KEYS[name]
                for contender in s.contenders:
                    _prepare(contender, key, s, server.url)
                    provider = FakeProviderServer(
                        capacity=NO_CONCURRENCY_LIMIT, scale=s.scale, seed=s.seed, tokens=MAX_TOKENS,
                        ceilings=dict(key.limits), style=key.style, outside=dict(key.outside),
                        rpm_burst_s=key.rpm_burst_s, cache_read_share=key.cache_read_share)
                    url = provider.start()
                    start: list[int] = []
                    at_change: list[dict[str, Any]] = []

                    def change() -> None:
                        at_change.append(provider.stats())
                        if key.lowered:  # the provider lowers the key's limits, and says so only in its headers
                            provider.configure(ceilings=dict(key.lowered))
                        else:  # a pod dies with its rounds in flight
                            pods.kill(0)

                    def at_start() -> None:
                        start.append(_on_a_minute(provider, s.scale))
                        if contender == "ceilings":
                            _one_provider_minute(key, server.url)
                        if key.change_minute is not None:
                            timer = threading.Timer(key.change_minute * C.MINUTE / s.scale, change)
                            timer.daemon = True
                            timer.start()
                            timers.append(timer)

                    if progress:
                        print(f"ceilings case: {name} / {LABELS[contender]} ({s.real_s:.0f} s) ...",
                              file=sys.stderr, flush=True)
                    job = {"contender": contender, "provider_url": url, "redis_url": server.url,
                           "alternative": key.alternative,
                           "scale": s.scale, "seed": s.seed, "workers": s.workers, "real_s": s.real_s,
                           "limits": {k: v * s.scale for k, v in key.limits.items()}}  # per real minute
                    timers: list[threading.Timer] = []
                    try:
                        reports = pods.run(job, at_start)
                        stats = provider.stats()
                    finally:
                        for timer in timers:
                            timer.cancel()
                        provider.stop()
                    closed = _closed(server.url) if key.alternative else None
                    if key.change_minute is not None and not at_change:
                        raise RuntimeError(f"ceilings case: the run ended before minute {key.change_minute}, "
                                           "when the run changes")
                    if pods.killed:  # the next contender starts with every pod alive
                        pods.close()
                        pods = CeilingPods(s.pods)
                    rows.append(_row(contender, key, s, stats, start[0], reports, at_change[0] if at_change else None,
                                     closed))
        finally:
            pods.close()
    return {"case": "ceilings", "settings": dataclasses.asdict(s),
            "keys": {n: KEYS[n].about for n in s.keys}, "rows": rows,
            "elapsed_s": round(time.monotonic() - started, 1)}


COLUMNS = ("key", "contender", "provider 429s", "429s per ceiling", "used % (minutes 2+)", "binding", "rounds")


def render(result: dict[str, Any], markdown: bool = False) -> str:
    s = result["settings"]
    rows = [[r["key"], r["label"], f"{r['provider_429']:,}",
             ", ".join(f"{k} {v:,}" for k, v in r["provider_429_by"].items()) or "—",
             ", ".join(f"{k} {v:g}" for k, v in r["used_pct"].items() if v is not None),
             "—" if r["binding"] is None else f"{r['binding']} {r['binding_used_pct']:g} %", f"{r['rounds']:,}"]
            for r in result["rows"]]
    head = (f"admission bench --provider --case ceilings — {s['pods']} pods × {s['workers']} workers, "
            f"{s['minutes']:g} provider minutes per contender at scale {s['scale']:g}, seed {s['seed']}, {s['engine']}")
    lines = table(COLUMNS, rows, markdown, right=(2, 6))
    keys = [f"{n}: {about}" for n, about in result["keys"].items()]
    for r in result["rows"]:
        if "completions_by_model" in r:
            by = r["completions_by_model"]
            keys.append(f"{r['key']} / {r['label']}: {by[MODEL]:,} calls on the key's model, then {by[ALT_MODEL]:,} on "
                        f"the alternative; the scope {'closed on ' + r['closed'] if r['closed'] else 'still open'}")
        if "after_change_429_by" in r:
            keys.append(f"{r['key']} / {r['label']}: after the change, 429s "
                        + (", ".join(f"{k} {v:,}" for k, v in r["after_change_429_by"].items()) or "none")
                        + "; used of the new limits: "
                        + ", ".join(f"{k} {v:g} %" for k, v in r["after_change_used_pct"].items() if v is not None))
    return "\n".join([f"**{head}**" if markdown else head, ""] + lines + ["", *(("- " if markdown else "") + k
                                                                          for k in keys),
                      f"{'- ' if markdown else ''}used %: what the mesh's requests counted of each per-minute "
                      "limit (less the outside traffic) in minutes 2 to the end, the provider's count; "
                      f"whole run {result['elapsed_s']:.0f} s"])
