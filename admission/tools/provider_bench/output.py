"""The figures as a table (plain text, or Markdown for the docs) with their notes."""
from __future__ import annotations

from typing import Any

from ..tables import table
from .settings import POOL

COLUMNS = ("mode", "drain s", "429s", "peak in flight", "rounds/s", "latency mean s", "latency p95 s",
           "requests", "limit")


def settings_line(result: dict[str, Any]) -> str:
    s, v = result["settings"], result["versions"]
    return (f"rounds {s['rounds']}, pods {s['pods']}, capacity {s['capacity']}, scale {s['scale']:g}, "
            f"tokens {s['tokens']}, seed {s['seed']}; {v['engine']}, Python {v['python']}, openai {v['openai']}, "
            f"httpx {v['httpx']}, admission {v['admission']}, {v['machine']}")


def table_rows(result: dict[str, Any]) -> list[list[str]]:
    return [[r["label"], f"{r['drain_s']:.2f}", f"{r['provider_429']:,}",
             f"{r['peak_in_flight']} / {r['capacity']}", f"{r['rounds_per_s']:.1f}",
             f"{r['latency_mean_s']:.2f}", f"{r['latency_p95_s']:.2f}", f"{r['requests']:,}", r["limit"]]
            for r in result["rows"]]


def notes(result: dict[str, Any]) -> list[str]:
    s = result["settings"]
    tun = ", ".join(f"{k} {v:g}" for k, v in result["policy"]["tunables"].items())
    return [
        f"ideal drain of a fixed limit K (K at a time, no overhead): {result['ideal_drain_s']:.2f} s; "
        f"bound {result['bound_s']:.0f} s",
        "drain = first request to the last round's 200; latency = burst start to the round's 200 "
        "(waiting and backoff included); 429s, peak and requests are the provider's own counts",
        f"(a) and (c) back off a 429 with full jitter, base {s['backoff_base']:g} s doubling to "
        f"{s['backoff_cap']:g} s (real seconds, not scaled)",
        f"(b): one lane owning pool {POOL}, default tunables except the provider's durations / scale: {tun}; "
        f"the wrapper retries a 429 through the admission (a new round each time)",
        f"whole run {result['elapsed_s']:.0f} s",
    ]


def render(result: dict[str, Any], markdown: bool = False) -> str:
    rows, head = table_rows(result), settings_line(result)
    title = f"**admission bench --provider** — {head}" if markdown else f"admission bench --provider — {head}"
    lines = table(COLUMNS, rows, markdown, right=range(1, len(COLUMNS) - 1))
    return "\n".join([title, ""] + lines + [""] + [("- " if markdown else "") + n for n in notes(result)])
