"""The grid's table and notes (plain text, or Markdown for the README)."""
from __future__ import annotations

from typing import Any, Sequence

from ..tables import table
from .policy import (MANY_LANES, SERVER_BLOCK, TARGET_EXTRA, TARGET_EXTRA_MANY_LANES, TARGET_FLAT_RATIO,
                     TARGET_SERVER, TARGET_SERVER_MANY_LANES, extra_target, server_target)


def report(head: str, columns: Sequence[str], rows: list[list[str]], notes: list[str], markdown: bool) -> str:
    """A table of figures (every column right-aligned) under its head, with its notes."""
    if markdown:
        out = [f"**{head}**", ""] + table(columns, rows, True, right=range(len(columns)))
        return "\n".join(out + [""] + [f"- {n}" for n in notes])
    return "\n".join([head, ""] + table(columns, rows, False, right=range(len(columns))) + [""] + notes)


COLUMNS = ("lanes", "seats", "waiters", "admit−PING p50", "p99", "release−PING p50", "p99", "floor−PING p50",
           "PING p50", "server admit", "server release", "server floor", "admit ÷ floor", "vs smallest")


def _mark(ok: bool) -> str:
    return "✓" if ok else "✗"


def _row(c: dict[str, Any]) -> list[str]:
    lanes = c["lanes"]
    return [str(lanes), f"{c['seats']:,}", f"{c['waiters']:,}",
            f"{c['admit_extra_p50']:.0f} {_mark(c['admit_extra_p50'] <= extra_target(lanes))}",
            f"{c['admit_extra_p99']:.0f}",
            f"{c['release_extra_p50']:.0f} {_mark(c['release_extra_p50'] <= TARGET_EXTRA)}",
            f"{c['release_extra_p99']:.0f}", f"{c['floor_extra_p50']:.0f}", f"{c['ping_p50']:.0f}",
            f"{c['server_admit_usec']:.0f} {_mark(c['server_admit_usec'] <= server_target(lanes))}",
            f"{c['server_release_usec']:.0f}", f"{c['server_floor_usec']:.0f}",
            f"{c['server_admit_usec'] / c['server_floor_usec']:.2f}×" if c["server_floor_usec"] > 0 else "–",
            f"{c['vs_smallest']:.2f}× {_mark(c['vs_smallest'] <= TARGET_FLAT_RATIO)}"]


def render(result: dict[str, Any], markdown: bool = False) -> str:
    rows = [_row(c) for c in result["cases"]]
    t = result["targets"]
    head = (f"admission bench — {result['engine']} {result['version']}, Python {result['python']}, "
            f"{result['machine']}; {result['iterations']:,} iterations per case "
            f"(+{result['warmup']} warm-up); times in µs")
    met = lambda k: f"met in {t[k]['met']}/{t[k]['cases']} cases"  # noqa: E731
    notes = [
        "X−PING = the call's round trip minus the PING of the same iteration (same loop, same "
        "connection, so the machine's noise hits both); p50 and p99 of those differences",
        "floor = a function with an admit's reads and writes (config, sweep range, ticket, seat, pool, "
        "provider, lane counts; seq, seat hash, lease, counts, tombstone, event, totals) and no rules: "
        "what any admit must cost",
        "server = the server's own µs per call (INFO commandstats cmdstat_fcall over a block of "
        f"{SERVER_BLOCK:,} calls of one kind, after the timed loop, in the case's state); an empty function "
        f"costs {result['empty_script_usec']:.1f} µs/call here",
        f"target: admit−PING p50 ≤ {TARGET_EXTRA:.0f} µs (≤ {TARGET_EXTRA_MANY_LANES:.0f} with "
        f"{MANY_LANES} lanes) — {met('admit_extra')}",
        f"target: release−PING p50 ≤ {TARGET_EXTRA:.0f} µs — {met('release_extra')}",
        f"target: server admit ≤ {TARGET_SERVER:.0f} µs (≤ {TARGET_SERVER_MANY_LANES:.0f} with {MANY_LANES} "
        f"lanes) — {met('server_admit')}",
        f"target: flat in seats and waiters (admit−PING p50 ≤ {TARGET_FLAT_RATIO}× the case with the fewest "
        f"seats and waiters of the same lanes) — {met('flat_seats_waiters')} (worst "
        f"{t['flat_seats_waiters']['max']:.2f}×)",
        "lanes (median admit−PING p50): " + ", ".join(
            f"{k} lanes {v:.0f} µs" for k, v in t["lanes_median_admit_extra_p50"].items()),
        "admit ÷ floor = the server's µs per admit over the floor's, in the same server and run: how speed "
        "is judged on this noisy machine (median by lanes: " + ", ".join(
            f"{k} lanes {v:.2f}×" for k, v in t.get("lanes_median_admit_over_floor", {}).items()) + ")",
        "with waiters the measured round is the lane's oldest waiter, so its admit also removes its "
        "ticket (a few more commands than a newcomer's admit, none of them scanning the queue)",
    ]
    pods = result.get("pods")
    if pods:
        notes.append(f"{pods['pods']} pod processes ({pods['lanes']} lanes, {pods['seconds']:.0f} s, each an "
                     f"admit and a release per decision): {pods['per_second']:,.0f} decisions/s")
    notes.append(f"whole run {result['elapsed_s']:.0f} s")
    return report(head, COLUMNS, rows, notes, markdown)
