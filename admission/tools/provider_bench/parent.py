"""The parent: a provider per mode, the pods, the figures."""
from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import math
import os
import platform
import sys
import time
from typing import Any

from ...core import mesh_key
from ...policy import TUNABLES
from ..logs import quiet_logs
from ..servers import LocalServer
from ..stats import percentile
from .pods import Job, Pods
from .settings import (LABELS, MESH, MODES, POOL, SEMAPHORE, WRAP_RETRIES, NotDrained, Settings, bench_policy,
                       bound_s, ideal_drain_s)


class Progress:
    """tqdm on a terminal when it is importable; else a \\r line on a terminal; a line per mode on
    anything else; nothing when disabled."""

    def __init__(self, enabled: bool, total: int):
        self.enabled, self.total = enabled, total
        self.tty = enabled and sys.stderr.isatty()
        self.bar: Any = None
        self.label = ""
        self.last = -1

    def start(self, label: str) -> None:
        self.label, self.last = label, -1
        if not self.enabled:
            return
        if self.tty:
            try:
                from tqdm import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self.bar = tqdm(total=self.total, desc=label, unit="round", leave=False, dynamic_ncols=True)
                return
        else:
            print(f"provider bench: {label}: {self.total} rounds ...", file=sys.stderr, flush=True)

    def update(self, done: int) -> None:
        if not self.enabled or done == self.last:
            return
        if self.bar is not None:
            self.bar.update(done - max(0, self.last))
        elif self.tty:
            print(f"\r{self.label}: {done}/{self.total} rounds", end="", file=sys.stderr, flush=True)
        self.last = done

    def end(self, summary: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        elif self.tty:
            print("\r\033[K", end="", file=sys.stderr)
        print(f"provider bench: {self.label}: {summary}", file=sys.stderr, flush=True)

    def close(self) -> None:
        """A run that stopped: the bar (or the line) goes, nothing is printed."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        elif self.tty and self.last >= 0:
            print("\r\033[K", end="", file=sys.stderr, flush=True)


class SlotWatch:
    """The most slots the admission allowed: polled from the pool while (b) runs, and every
    ``grew`` event of the mesh read afterwards (the estimate rises only by those)."""

    def __init__(self, url: str):
        import redis

        self.redis = redis.Redis.from_url(url, socket_timeout=5)
        self.key = mesh_key(MESH, "pool", POOL)
        self.max_est = float(TUNABLES["seed_estimate"][0])

    def poll(self) -> None:
        with contextlib.suppress(Exception):
            est = self.redis.hget(self.key, "est")
            if est is not None:
                self.max_est = max(self.max_est, float(est))

    def finish(self) -> dict[str, Any]:
        events = self.redis.xrange(mesh_key(MESH, "events"))
        for _id, fields in events:
            if fields.get(b"kind") == b"grew" and fields.get(b"pool") == POOL.encode():
                self.max_est = max(self.max_est, float(fields[b"est"]))
        est, cap = self.redis.hmget(self.key, "est", "cap")
        decreases = sum(1 for _id, f in events if f.get(b"kind") == b"exhausted")
        self.redis.close()
        return {"max_slots": max(1, math.floor(self.max_est)), "final_estimate": float(est or 0),
                "final_cap": float(cap or 0), "decreases": decreases}


def _prepare(mode: str, s: Settings, redis_url: str) -> SlotWatch | None:
    import redis

    from ...client import Admission

    r = redis.Redis.from_url(redis_url)
    try:
        if mode == "admission":
            r.flushall()
            adm = Admission(r, mesh=MESH, pod="bench-parent", background=False)
            adm.ops.apply_policy(bench_policy(s.scale), recovery_hold=False)
            return SlotWatch(redis_url)
        if mode == "semaphore":
            with r.pipeline() as pipe:
                pipe.delete(SEMAPHORE)
                pipe.rpush(SEMAPHORE, *[f"t{i}" for i in range(s.capacity)])
                pipe.execute()
        return None
    finally:
        r.close()


def _row(mode: str, s: Settings, reports: list[dict[str, Any]], stats: dict[str, Any],
         slots: dict[str, Any] | None, bound: float) -> dict[str, Any]:
    items = [it for rep in reports for it in rep["items"]]
    done = [it for it in items if it["done"] is not None]
    if len(done) < s.rounds:
        errors = sorted({it["error"] for it in items if it["error"]})
        raise NotDrained(f"{LABELS[mode]} did not drain within the bound of {bound:.3g} s: "
                         f"{len(done)} of {s.rounds} rounds done" + (f" (last error: {errors[-1]})" if errors else ""))
    first = min(rep["first_request"] for rep in reports if rep["first_request"] is not None)
    latencies = [it["done"] - rep["start"] for rep in reports for it in rep["items"]]
    drain = max(it["done"] for it in done) - first
    total = stats["total"]
    client_statuses: dict[str, int] = {}
    for rep in reports:
        for k, v in rep["statuses"].items():
            client_statuses[k] = client_statuses.get(k, 0) + v
    row = {
        "mode": mode, "label": LABELS[mode], "rounds": len(done), "drain_s": round(drain, 3),
        "provider_429": int(total.get("429", 0)), "provider_529": int(total.get("529", 0)),
        "peak_in_flight": int(total.get("peak_in_flight", 0)), "capacity": s.capacity,
        "over_capacity_s": total.get("over_capacity_s", 0.0),
        "requests": int(total.get("requests", 0)), "completions": int(total.get("completions", 0)),
        "rounds_per_s": round(len(done) / drain, 2) if drain > 0 else float("nan"),
        "latency_mean_s": round(sum(latencies) / len(latencies), 3),
        "latency_p95_s": round(percentile(latencies, 0.95), 3),
        "latency_max_s": round(max(latencies), 3),
        "client_statuses": dict(sorted(client_statuses.items())),
        "client_refusals_seen": sum(it["refused"] for it in items),
    }
    if mode == "none":
        row["limit"] = "none"
    elif mode == "semaphore":
        row["limit"] = f"{s.capacity} tokens"
    else:
        assert slots is not None
        row.update(slots)
        cap = f"{slots['final_cap']:g}" if slots["final_cap"] else "never measured"
        row["limit"] = f"slots ≤ {slots['max_slots']} (at the end K̂ {slots['final_estimate']:.1f}, K {cap})"
    return row


def run(s: Settings, progress: bool = False) -> dict[str, Any]:
    """The three modes, one after another; the figures as a dict (what --json prints)."""
    from ..fake_provider import FakeProviderServer

    if s.rounds < 1 or s.pods < 1 or s.capacity < 1 or not s.scale > 0 or s.tokens < 1:
        raise ValueError("rounds, pods, capacity, scale and tokens must be positive")
    bound = bound_s(s)
    started = time.monotonic()
    bar = Progress(progress, s.rounds)
    rows: list[dict[str, Any]] = []
    with quiet_logs(library=False), LocalServer(s.engine) as server:
        pods = Pods(s)
        finished = False
        try:
            for mode in MODES:
                watch = _prepare(mode, s, server.url)
                provider = FakeProviderServer(capacity=s.capacity, scale=s.scale, seed=s.seed, tokens=s.tokens)
                url = provider.start()
                bar.start(LABELS[mode])
                try:
                    def tick(done: int) -> None:
                        bar.update(done)
                        if watch is not None:
                            watch.poll()

                    reports = pods.run(Job(mode, url, server.url, bound), tick)
                    stats = provider.stats()
                finally:
                    provider.stop()
                slots = watch.finish() if watch is not None else None
                row = _row(mode, s, reports, stats, slots, bound)
                rows.append(row)
                bar.end(f"drained in {row['drain_s']:.2f} s, {row['provider_429']} × 429")
            finished = True
        finally:
            bar.close()
            pods.close(wait=10.0 if finished else 1.0)
        version = server.version
    return {
        "settings": dataclasses.asdict(s),
        "versions": _versions(s.engine, version),
        "ideal_drain_s": round(ideal_drain_s(s.rounds, s.tokens, s.capacity, s.scale), 3),
        "bound_s": round(bound, 1),
        "policy": bench_policy(s.scale),
        "wrap_retries": WRAP_RETRIES,
        "rows": rows,
        "elapsed_s": round(time.monotonic() - started, 1),
    }


def _versions(engine: str, server_version: str | None) -> dict[str, str]:
    def version(name: str) -> str:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "?"

    return {"engine": f"{engine} {server_version or '?'}", "python": platform.python_version(),
            "openai": version("openai"), "httpx": version("httpx"), "admission": version("admission"),
            "machine": f"{platform.machine()} {os.cpu_count()} cpu"}
