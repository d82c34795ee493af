"""Plain-text rendering for the CLI: the census (and its legend), the ledger, the events stream
and the refusal counts: what an operator reads at a glance. The census text is the demo's screen
too (admission/tools/demo.py), and its state words the served page's. Plain text only: no colours or
terminal codes (the CLI redraws a terminal itself)."""
from __future__ import annotations

import time
from typing import Any, Iterable, Mapping

#: ``admission census --explain``: what the words of the census mean (docs/design.md §2, §5).
LEGEND = """\
legend
  K̂           the estimate: how many rounds the pool is believed to serve at once right now. It
              grows step by step while there is demand and no load signal (slow start x2, then
              logistic towards K) and drops to 0.7 x the rounds running on a load signal.
  K           the carrying capacity: how many rounds ran when the pool last signalled overload
              (a 429, a stall, the round cap); 0 = never measured (slow start).
  slots       max(1, floor(K̂)): how many rounds may run at once; free = slots - running.
  guaranteed  the lane's floor share of the slots (largest remainder, among the lanes with work;
              at least 1 for a waiting lane with a floor). Below it a lane is admitted while a
              slot is free (on a never-measured pool even when none is: overdraft).
  borrowed    the lane's running rounds above its guarantee: slots lent by lanes without work,
              shared by weight (fair share) and by the draw p(free share).
  must yield  lanes that borrow while a lane below its floor waits: they are refused at their next
              round boundary (nothing is killed) until the owed slots are back; owed = those slots.
  bound       running + how many more rounds of the lane would start now.
  delegated   sub-rounds admitted at once on their parent's lane (the parent holds a seat).
  cap line    the most rounds in flight at which every running round that declared its size
              still ends before round_cap, by the seconds per token measured at each load: no
              round starts past it (reason cap-line), nor one that would not end by its cap.
  starving    a closed provider with work waiting, a lane below its floor waiting longer than
              starved_after, or a hard-pinned round waiting that long."""


def utc_iso(t: float, ms: bool = False) -> str:
    """Epoch seconds as ISO-8601 UTC: 2026-11-30T12:34:56Z (with milliseconds: ...56.789Z)."""
    base = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t))
    return f"{base}.{int(round(t * 1000)) % 1000:03d}Z" if ms else base + "Z"


def event_time(event_id: str) -> str:
    """The ISO-8601 UTC time of a stream entry, from its id (milliseconds of the server's clock)."""
    return utc_iso(int(event_id.split("-", 1)[0]) / 1000, ms=True)


def render_event(event_id: str, fields: Mapping[str, str]) -> str:
    """One line per event: its time, ``kind=<kind>`` and the fields that say something."""
    rest = " ".join(f"{k}={v}" for k, v in fields.items() if k != "kind" and v != "")
    return f"{event_time(event_id)} kind={fields.get('kind', '?')}" + (f" {rest}" if rest else "")


def render_refusals(rows: Iterable[tuple[str, str, str, int]], start: float, end: float) -> str:
    """The refusal counts of a window (one row per pool x lane x reason, most first in a pool)."""
    rows = list(rows)
    head = f"refusals from {utc_iso(start)} to {utc_iso(end)}"
    if not rows:
        return head + ": none"
    wp = max(4, *(len(r[0]) for r in rows))
    wl = max(4, *(len(r[1]) for r in rows))
    wr = max(6, *(len(r[2]) for r in rows))
    lines = [head + ", pool x lane x reason", f"{'pool':<{wp}}  {'lane':<{wl}}  {'reason':<{wr}}  {'count':>7}"]
    for pool, lane, reason, n in rows:
        lines.append(f"{pool:<{wp}}  {lane:<{wl}}  {reason:<{wr}}  {n:>7}")
    lines.append(f"{'total':<{wp + wl + wr + 4}}  {sum(r[3] for r in rows):>7}")
    return "\n".join(lines)


def _num(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.1f}" if x != int(x) else str(int(x))
    return str(x)


def estimate_state(p: Mapping[str, Any]) -> str:
    """Whether the pool's K is measured: ``exhausted (<the signal>)`` once a load signal measured
    it, else ``slow start``. Every rendering of the census (this text, the demo's status line, the
    served page) words it so."""
    return f"exhausted ({p.get('why') or '?'})" if p.get("exhausted") else "slow start"


def pool_state(p: Mapping[str, Any], at: float) -> str:
    """The pool line's state: paused, closed, measured or not, probing, the cap line."""
    state = estimate_state(p)
    if p.get("probingFrom"):  # an upward probe: K from probingFrom, tested by probeRuns of that many rounds
        state += (f", probing K above {_num(p['probingFrom'])} ({_num(p.get('probeRuns', 0))} of "
                  f"{_num(p['probingFrom'])} rounds ran above it)")
    if (p.get("probeBackoff") or 1) > 1:
        state += f", probes back off x{_num(p['probeBackoff'])}"
    if p.get("closedUntil"):
        state = (f"CLOSED ({p['closedWhy']}) until "
                 f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(p['closedUntil']))}Z, {state}")
    if p.get("capLine"):  # the cap line: the declared rounds running end before their caps
        state += f", cap line at {p['capLine']:.1f} rounds"
    if p.get("pausedUntil"):  # the provider's Retry-After
        state = f"PAUSED {p['pausedUntil'] - at:.0f}s (provider's Retry-After), {state}"
    return state


def plane_text(pl: Mapping[str, Any]) -> str:
    """A pool's plane: its depth, retry budget and health sample (the text's and the page's)."""
    parts = [f"depth {_num(pl.get('depth'))}" + (f"/{_num(pl['depthLimit'])}" if pl.get("depthLimit") else "")]
    if pl.get("retryBudget") is not None:
        parts.append(f"retries left {_num(pl.get('retriesLeft'))}/{_num(pl['retryBudget'])}")
    if pl.get("healthAgeSeconds") is not None:
        state = "fresh" if pl.get("healthFresh") else ("NOT OK" if not pl.get("healthOk") else "STALE")
        parts.append(f"health {pl['healthAgeSeconds']:.0f}s old ({state}, max {_num(pl.get('healthMaxAge'))}s)")
    elif pl.get("healthRequired"):
        parts.append("health NO SAMPLE (borrows shed)")
    return ", ".join(parts)


def ceiling_text(c: Mapping[str, Any]) -> str:
    """A rate-ceiling scope in one line (the text's and the page's): each limit's level of its
    effective ceiling (configured, learned from the headers), what the rounds in flight reserved,
    the use over the last minute, the wait of the next round, the refusals and the accuracy."""
    limits = []
    for l in c.get("limits") or []:
        src = "/".join(f"{k} {_num(l[k])}" for k in ("configured", "learned") if l.get(k) is not None)
        level = f"{_num(round(l['level']))}/" if l.get("level") is not None else ""
        held = " HELD" if l.get("heldUntil") else ""
        limits.append(f"{l['limit']} {level}{_num(round(l['effective']))} ({src}){held}")
    used = c.get("usedLastMinute") or {}
    parts = [", ".join(limits) or "no limit",
             f"in flight {c.get('reservedRequests', 0)} req {_num(round(c.get('reservedTokens', 0)))} tok",
             f"last minute {_num(round(used.get('requests', 0)))} req {_num(round(used.get('tokens', 0)))} tok",
             f"next in {c.get('waitSeconds', 0):.1f}s"]
    refusals = c.get("refusals") or {}
    if refusals:
        parts.append("refused " + " ".join(f"{k.removeprefix('ceiling-')} {v}" for k, v in sorted(refusals.items())))
    acc = c.get("accuracy")
    if acc:
        parts.append(f"counted/reserved median {acc['median']:.2f} p95 {acc['p95']:.2f} (n {acc['samples']})")
    reading = c.get("reading")
    if reading:
        parts.append(f"header read {reading.get('ageSeconds', 0):.0f}s ago")
    if c.get("closedUntil"):
        parts.append(f"CLOSED ({c.get('closedWhy')}) until "
                     f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(c['closedUntil']))}Z")
    return "; ".join(parts)


def render_census(doc: dict[str, Any]) -> str:
    """``admission census``: the census as text (see census_lines)."""
    return "\n".join(census_lines(doc))


def census_lines(doc: Mapping[str, Any], done: Mapping[str, int] | None = None) -> list[str]:
    """One block per pool (estimate, K, counts, why), one line per lane with work, then starving.
    ``done`` (the demo's: rounds its pods finished, by lane) adds a column to the lane lines."""
    lines = [f"mesh {doc.get('mesh')}  policy v{doc.get('configVersion')}  at "
             f"{time.strftime('%H:%M:%S', time.gmtime(doc.get('at', 0)))}Z"]
    for p in doc["pools"]:
        state = pool_state(p, doc.get("at", 0))
        lines.append(f"pool {p['pool']:<23} K̂ {_num(p['capacity']):>5}  K {_num(p['carryingCapacity']):>4}  "
                     f"slots {p['slots']:>3}  running {p['running']:>3}  waiting {p['waiting']:>3}  "
                     f"free {p['free']:>3}  {state}  ok/fail {_num(p['successes'])}/{_num(p['failures'])}  "
                     f"mean {_num(p['meanSeconds'])}s ${p['meanCostUsd']:.4f}")
        if p.get("budgetLimitUsd") is not None:
            left = p["budgetLimitUsd"] - p["budgetSpentUsd"] - p["committedUsd"]
            read = (f", read {time.strftime('%H:%M', time.gmtime(p['budgetAt']))}Z" if p.get("budgetAt") else "")
            lines.append(f"    budget of {p['provider']} today: spent ${p['budgetSpentUsd']:,.2f} + in flight "
                         f"${p['committedUsd']:,.2f} of ${p['budgetLimitUsd']:,.2f} (left ${left:,.2f}){read}")
        for l in p["lanes"]:
            since = l.get("oldestWaitingSince")
            wait = f"  oldest waiting {doc['at'] - since:.0f}s" if since else ""
            reserve = (f"  before its reserve ${l['reserveLeftUsd']:,.2f}" if l.get("reserveLeftUsd") is not None
                       else "")
            lines.append(f"    {l['lane']:<12} running {l['running']:>3}  waiting {l['waiting']:>3}  "
                         f"guaranteed {l['guaranteed']:>3}  borrowed {l['borrowed']:>3}  bound {l['bound']:>3}  "
                         f"delegated {l['delegated']:>2}  spent today ${l['spentTodayUsd']:.2f}{reserve}{wait}"
                         + (f"  done {done.get(l['lane'], 0)}" if done is not None else ""))
        if p.get("alternatives") or p.get("movedIn") or p.get("movedOut"):
            alts = ", ".join(p.get("alternatives") or []) or "none"
            lines.append(f"    moves: running here after a move {p.get('moved', 0)}, moved in {p.get('movedIn', 0)}, "
                         f"moved out {p.get('movedOut', 0)}; alternatives: {alts}")
        if p.get("plane"):
            lines.append("    plane: " + plane_text(p["plane"]))
        if p.get("hardPinned"):
            hp = p["hardPinned"]
            lines.append(f"    hard-pinned to {hp['to']}: {hp['waiting']} waiting, oldest "
                         f"{doc['at'] - hp['oldestWaitingSince']:.0f}s")
        if p["mustYield"]:
            yielders = ", ".join(f"{y['lane']} ({y['borrowed']})" for y in p["mustYield"])
            lines.append(f"    must yield at their next round: {yielders}; owed {p['owed']}")
    for c in doc.get("ceilings") or []:  # the rate ceilings: one line per scope
        lines.append(f"ceilings {c['scope']} ({', '.join(c.get('pools') or [])}): {ceiling_text(c)}")
    for s in doc["starving"]:
        if s["kind"] == "provider-closed":
            lines.append(f"STARVING provider-closed: {s['provider']} ({s['why']}) with {s['waiting']} waiting on "
                         f"{s['pool']} until {time.strftime('%H:%M', time.gmtime(s['closedUntil']))}Z")
            continue
        if s["kind"] == "pinned":
            lines.append(f"STARVING pinned: {s['waiting']} hard-pinned round(s) waiting for {s['pool']} since "
                         f"{time.strftime('%H:%M:%S', time.gmtime(s['waitingSince']))}Z")
            continue
        lines.append(f"STARVING {s['kind']}: lane {s.get('lane')} on {s.get('pool')} waiting since "
                     f"{time.strftime('%H:%M:%S', time.gmtime(s['waitingSince']))}Z")
    return lines


def render_ledger(day: str, ledger: dict[str, dict[str, float]]) -> str:
    """The day's spend, lane x provider, with each provider's total (the `*` row) last."""
    providers = sorted({p for row in ledger.values() for p in row})
    if not providers:
        return f"ledger {day}: nothing spent"
    width = max(10, *(len(p) for p in providers))
    lines = [f"ledger {day} (USD)", f"{'lane':<14}" + "".join(f"{p:>{width + 2}}" for p in providers)]
    for lane in sorted(l for l in ledger if l != "*") + (["*"] if "*" in ledger else []):
        name = "total" if lane == "*" else lane
        lines.append(f"{name:<14}" + "".join(f"{ledger[lane].get(p, 0.0):>{width + 2}.6f}" for p in providers))
    return "\n".join(lines)
