"""The figures of many runs: summaries (mean, min, max), the printed table, the JSON and the
plots (matplotlib is optional: ``pip install admission[plots]``)."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable

from .. import write_json as write_tool_json
from . import scenarios

SCALARS = ("rate_limited", "cut", "stalled", "red_main_start_minutes", "red_main_behind", "tokens_per_s",
           "sim_minutes", "rate_limited_per_10min")
PER_KEY = ("drain_minutes", "start_minutes", "peak_in_flight", "minutes_above_k", "peak_over_estimate", "utilisation",
           "estimate_within_one")
#: provider-day (day.DaySim.figures)
DAY_SCALARS = ("limit_usd", "policy_limit_usd", "over_policy_limit_usd", "spend_total_usd", "overshoot_usd",
               "left_usd", "ledger_usd", "limit_reached_hour",
               "in_flight_at_limit", "in_flight_usd_at_limit", "provider_403", "fast_403", "fast_403_probes",
               "cut_by_403", "cut_by_403_usd",
               "storm_rounds", "storm_hours", "storm_from_hour", "closures", "closed_hour", "probes",
               "probes_clean", "resumed_minutes",
               # provider-day-fallback (day.DaySim.fallback_figures)
               "moved_max_minutes", "move_wait_max_minutes", "round_minutes", "moved_rounds",
               "moved_after_closure", "eu_rounds", "eu_on_router", "pinned_wait_minutes", "pinned_starving_minutes",
               "pinned_waiting_peak", "other_spend_total_usd")
DAY_PER_KEY = ("spend_usd", "stopped_hour", "done", "refusals",
               "moved_minutes", "move_wait_minutes", "back_minutes", "asks_after_closure", "elsewhere_at_closure",
               "probes_by_lane", "other_spend_usd")
#: ceilings (ceiling_run.CeilingSim.figures)
CEILING_SCALARS = ("provider_429", "binding_used_pct", "rounds_done")
CEILING_PER_KEY = ("provider_429_by", "used_pct_by", "refusals")
#: words, counted over the runs: {value: runs}, per lane for the dict-valued ones
DAY_WORDS = ("closed_by", "stopped_by", "lane_role", "pinned_waited_to_end", "binding")


def _stats(values: list[float | None]) -> dict[str, Any]:
    got = [v for v in values if v is not None]
    if not got:
        return {"mean": None, "min": None, "max": None, "n": 0}
    return {"mean": sum(got) / len(got), "min": min(got), "max": max(got), "n": len(got)}


def _count(values: Iterable[Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[str(v)] = out.get(str(v), 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """mean / min / max of every figure over the runs (None where no run has it), with ``n``
    (how many runs have it: a lane that did not drain within the horizon has no drain time)."""
    out: dict[str, Any] = {"mean": {}, "min": {}, "max": {}, "n": {}}
    for name in SCALARS + DAY_SCALARS + CEILING_SCALARS:
        if name not in runs[0]:
            continue
        s = _stats([r[name] for r in runs])
        for k in ("mean", "min", "max", "n"):
            out[k][name] = s[k]
    for name in DAY_WORDS:
        if name not in runs[0]:
            continue
        if isinstance(runs[0][name], dict):
            out[name] = {key: _count(r[name].get(key) for r in runs) for key in runs[0][name]}
        else:
            out[name] = _count(r[name] for r in runs)
    for name in PER_KEY + DAY_PER_KEY + CEILING_PER_KEY:
        if name not in runs[0]:
            continue
        keys = list(dict.fromkeys(k for r in runs for k in r[name]))
        for k in ("mean", "min", "max", "n"):
            out[k][name] = {}
        for key in keys:
            s = _stats([r[name].get(key) for r in runs])
            for k in ("mean", "min", "max", "n"):
                out[k][name][key] = s[k]
    out["capacity"] = runs[0]["capacity"]
    out["runs"] = len(runs)
    out["drained_runs"] = sum(1 for r in runs if r["drained"])
    return out


def collect(results: Iterable[tuple[Any, dict[str, Any], Any]], *, config: dict[str, Any]) -> dict[str, Any]:
    """Group run results by scenario and policy into the report document (what ``--json`` writes)."""
    by: dict[str, dict[str, list]] = {}
    for job, fig, _ in results:
        by.setdefault(job.scenario, {}).setdefault(job.policy, []).append(fig)
    doc: dict[str, Any] = {"config": config, "scenarios": {}}
    for name in scenarios.NAMES:
        if name not in by:
            continue
        sc = scenarios.make(name, config["capacity"])
        doc["scenarios"][name] = {
            "about": sc.about,
            "capacity": sc.pools,
            "policies": {p: {**summarize(by[name][p]), "per_run": by[name][p]}
                         for p in sc.policies if p in by[name]},
        }
        if sc.day:
            from .policies import day_reserves

            doc["scenarios"][name]["reserve"] = day_reserves()
    return doc


def write_json(doc: dict[str, Any], path: str | Path) -> None:
    """The simulator's JSON (numpy numbers as floats), its folder made when missing."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_tool_json(path, doc, indent=1, default=float)


# -- the table --------------------------------------------------------------------------------
def _num(x: float, digits: int) -> str:
    return f"{x:.{digits}f}"


def _cell(s: dict[str, Any], name: str, key: str | None = None, digits: int = 0, *,
          horizon: float | None = None) -> str:
    mean, lo, hi, n = (s[k][name] if key is None else s[k][name].get(key) for k in ("mean", "min", "max", "n"))
    runs = s["runs"]
    if n == 0:
        return f">{horizon:.0f}" if horizon is not None else "—"
    text = f"{_num(mean, digits)} [{_num(lo, digits)}–{_num(hi, digits)}]" if runs > 1 else _num(mean, digits)
    if n < runs:
        text += f" ({n}/{runs} drained)" if horizon is not None else f" ({n}/{runs})"
    return text


def _short(pool: str) -> str:
    return pool.split("@")[0]


def table(doc: dict[str, Any]) -> str:
    """Per scenario: one row per policy, the means over the runs with [min–max]."""
    cfg = doc["config"]
    horizon = cfg["hours"] * 60.0
    drains = any(name not in scenarios.DAYS and name != "ceilings" for name in doc["scenarios"])
    lines = [f"{cfg['runs']} seeded runs per row (seed {cfg['seed']}), mean [min–max]; K = {cfg['capacity']:g}"
             + (f"; drain in minutes from the start of the load ('>{horizon:.0f}': not drained within "
                f"{cfg['hours']:g} h)" if drains else ""), ""]
    for name, sc in doc["scenarios"].items():
        if name in scenarios.DAYS:
            lines += day_table(sc, name)
            continue
        if name == "sustained":
            lines += sustained_table(sc)
            continue
        if name == "ceilings":
            lines += ceilings_table(sc)
            continue
        pols = sc["policies"]
        first = next(iter(pols.values()))
        groups = list(first["mean"]["drain_minutes"])
        pools = list(sc["capacity"])
        cols = [f"drain {g}" for g in groups]
        extra = []
        if name == "idle":
            extra = [f"start {g}" for g in groups]
        cols += extra + ["429s", "cut"]
        if name != "idle":
            cols.append("red mains start")
        cols += [f"peak {_short(p)}/K={sc['capacity'][p]:g}" for p in pools] + ["tok/s"]
        if name == "multipod":
            cols.append("peak over K̂")
        rows = []
        for pol, s in pols.items():
            row = [pol] + [_cell(s, "drain_minutes", g, horizon=horizon) for g in groups]
            if name == "idle":
                row += [_cell(s, "start_minutes", g, 2) for g in groups]
            row += [_cell(s, "rate_limited"), _cell(s, "cut")]
            if name != "idle":
                row.append(_cell(s, "red_main_start_minutes", digits=1))
            row += [_cell(s, "peak_in_flight", p) for p in pools] + [_cell(s, "tokens_per_s")]
            if name == "multipod":
                row.append(_cell(s, "peak_over_estimate", pools[0]) if s["n"]["peak_over_estimate"].get(pools[0]) else "—")
            rows.append(row)
        header = ["policy"] + cols
        widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
        lines.append(f"{name} — {sc['about']}")
        lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip())
        lines.append("  ".join("-" * w for w in widths))
        for r in rows:
            lines.append("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
        lines.append("")
    return "\n".join(lines)


def _percent(s: dict[str, Any], name: str, key: str) -> str:
    """A share (0..1) per key as a percentage cell, mean [min–max]."""
    if not s["n"][name].get(key):
        return "—"
    scaled = {q: {name: {key: s[q][name][key] * 100}} for q in ("mean", "min", "max")}
    return _cell({**scaled, "n": s["n"], "runs": s["runs"]}, name, key)


def sustained_table(sc: dict[str, Any]) -> list[str]:
    """The sustained load: 429s per 10 minutes, the provider's use, the estimate against K."""
    pool = next(iter(sc["capacity"]))
    k = sc["capacity"][pool]
    header = ["policy", "429s per 10 min", "utilisation %", f"K̂ within one of K={k:g} (% of samples)", "cut",
              f"peak/K={k:g}", "tok/s"]
    rows = []
    for pol, s in sc["policies"].items():
        rows.append([pol, _cell(s, "rate_limited_per_10min", digits=2), _percent(s, "utilisation", pool),
                     _percent(s, "estimate_within_one", pool), _cell(s, "cut"), _cell(s, "peak_in_flight", pool),
                     _cell(s, "tokens_per_s")])
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    out = [f"sustained — {sc['about']}", "  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip(),
           "  ".join("-" * w for w in widths)]
    out += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return out + [""]


def ceilings_table(sc: dict[str, Any]) -> list[str]:
    """ceilings: per policy, the provider's 429s (from minute 2; per ceiling over the run), the
    share of each per-minute limit the provider counted in minutes 2 to the end, and the rounds."""
    pols = sc["policies"]
    kinds = list(dict.fromkeys(k for s in pols.values() for k in s["mean"]["used_pct_by"]))
    header = ["policy", "provider 429s from min 2", *[f"429s {k} (whole run)" for k in kinds],
              *[f"{k} used % (min 2+)" for k in kinds],
              "binding", "rounds done"]
    rows = [[pol, _cell(s, "provider_429"), *[_cell(s, "provider_429_by", k) for k in kinds],
             *[_cell(s, "used_pct_by", k, 1) for k in kinds], _words(s["binding"], s["runs"]),
             _cell(s, "rounds_done")] for pol, s in pols.items()]
    return _block(f"ceilings — {sc['about']}", header, rows)


def _clock(h: float) -> str:
    m = int(round(h * 60))
    return f"{m // 60 % 24:02d}:{m % 60:02d}"


def _hour_cell(s: dict[str, Any], name: str, key: str | None = None) -> str:
    mean, lo, hi, n = (s[k][name] if key is None else s[k][name].get(key) for k in ("mean", "min", "max", "n"))
    runs = s["runs"]
    if n == 0:
        return "never"
    text = f"{_clock(mean)} [{_clock(lo)}–{_clock(hi)}]" if runs > 1 else _clock(mean)
    if n < runs:
        text += f" ({n}/{runs})"
    return text


_WHY = {"budget-reserve": "reserve", "budget-spent": "spent", "provider-closed": "closed", "403": "403",
        "key_daily_limit": "403", "budget_reached": "budget"}


def _words(counts: dict[str, int], runs: int) -> str:
    """The reasons over the runs: 'reserve', or 'spent 6, 403 4'."""
    named = {_WHY.get(k, k): v for k, v in counts.items() if k != "None"}
    if not named:
        return ""
    if len(named) == 1 and next(iter(named.values())) == runs:
        return next(iter(named))
    return ", ".join(f"{k} {v}" for k, v in named.items())


def day_table(sc: dict[str, Any], name: str = "provider-day") -> list[str]:
    """provider-day: the key and the storm per policy, then each lane (stop, spend, work done);
    with a second provider (provider-day-fallback) the moves replace the lanes' table."""
    out = key_block(sc, name)
    if "moved_rounds" in next(iter(sc["policies"].values()))["mean"]:
        return out + fallback_blocks(sc, name)
    return out + lanes_block(sc, name)


def key_block(sc: dict[str, Any], name: str) -> list[str]:
    """The key's day per policy: its limit, the 403s, the storm, the closures and the spend."""
    pols = sc["policies"]
    rows = []
    for pol, s in pols.items():
        closed = _hour_cell(s, "closed_hour")
        why = _words(s.get("closed_by", {}), s["runs"])
        rows.append([pol, _hour_cell(s, "limit_reached_hour"), _cell(s, "provider_403"), _cell(s, "fast_403"),
                     _cell(s, "fast_403_probes"), _cell(s, "cut_by_403"), _cell(s, "storm_rounds"),
                     _cell(s, "storm_hours", digits=1),
                     _cell(s, "closures") + (f" ({why})" if why else ""), closed if closed != "never" else "—",
                     _cell(s, "probes"), _cell(s, "spend_total_usd", digits=2), _cell(s, "overshoot_usd", digits=2),
                     _cell(s, "in_flight_usd_at_limit", digits=2), _cell(s, "in_flight_at_limit")])
    header = ["policy", "limit reached (UTC)", "403s", "ended <1 s on a 403", "of which probes",
              "cut running by a 403", "storm rounds",
              "storm hours", "closures", "closed at", "probes", "spend at 00:00 $", "overshoot $",
              "in flight at the limit $", "rounds in flight at the limit"]
    return _block(f"{name} — {sc['about']}; the key's day, per policy", header, rows)


def lanes_block(sc: dict[str, Any], name: str) -> list[str]:
    """Each lane per policy: its reserve, when and why it stopped, its spend and work done."""
    pols = sc["policies"]
    first = next(iter(pols.values()))
    limit = first["mean"]["limit_usd"]
    lanes = list(first["mean"]["spend_usd"])
    rows = []
    for pol, s in pols.items():
        for lane in lanes:
            why = _words(s["stopped_by"].get(lane, {}), s["runs"])
            reserve = sc.get("reserve", {}).get(lane)
            rows.append([pol, lane, "—" if reserve is None else f"{reserve:.0%}",
                         _hour_cell(s, "stopped_hour", lane) + (f" {why}" if why else ""),
                         _cell(s, "spend_usd", lane, 2), _cell(s, "done", lane)])
    header = ["policy", "lane", "reserve", "stopped (UTC), by", "spend $", "done by 00:00"]
    return _block(f"{name} — each lane (limit {limit:g} USD; stopped: the first refusal for the day or "
                  f"403, before 00:00)", header, rows)


def _or(s: dict[str, Any], name: str, key: str | None = None, digits: int = 1, none: str = "never") -> str:
    """A figure that may not happen in a run (None): ``none`` when it happened in none."""
    n = s["n"][name] if key is None else s["n"][name].get(key)
    return _cell(s, name, key, digits) if n else none


def _role(s: dict[str, Any], lane: str) -> str:
    return _words(s["lane_role"].get(lane, {}), s["runs"])


def fallback_blocks(sc: dict[str, Any], name: str) -> list[str]:
    """provider-day-fallback: from the first key's closure, how soon the lanes ran on the other
    provider (against one mean round), where the EU-routed rounds ran, how long the pinned lane
    waited; then each lane: its move, its spend on each key, its work done."""
    pols = sc["policies"]
    first = next(iter(pols.values()))
    keys = [pool.split("@")[-1] for pool in sc["capacity"]]
    spend = [f"spend {keys[0]} $", f"spend {' + '.join(keys[1:])} $"]
    rows = []
    for pol, s in pols.items():
        closed = _hour_cell(s, "closed_hour")
        eu = f"{_cell(s, 'eu_on_router')} of {_cell(s, 'eu_rounds')}"
        pinned = _or(s, "pinned_wait_minutes", digits=0, none="—")
        if s.get("pinned_waited_to_end", {}).get("True"):
            pinned += " (to the end)"
        rows.append([pol, closed if closed != "never" else "—", _or(s, "moved_max_minutes"),
                     _or(s, "move_wait_max_minutes"), _cell(s, "round_minutes", digits=1),
                     f"{_cell(s, 'moved_rounds')} ({_cell(s, 'moved_after_closure')})", eu, pinned,
                     f"{_or(s, 'pinned_starving_minutes', digits=0)}; {_cell(s, 'pinned_waiting_peak')}",
                     _cell(s, "provider_403"), _cell(s, "probes"), _cell(s, "spend_total_usd", digits=2),
                     _cell(s, "other_spend_total_usd", digits=2)])
    header = ["policy", f"{keys[0]} closed (UTC)", "every lane moved within, min", "from its first ask, min",
              "one round, min", "rounds moved (after the closure)", f"EU rounds on {keys[0]}",
              "pinned lane waited, min", "census: pinned starving after, min; most waiting", "403s", "probes",
              *spend]
    out = _block(f"{name} — moving off the closed key, per policy (from the first closure; within: the "
                 f"longest over the lanes with work after it; 'one round': the mean clean round)", header, rows)
    rows = []
    for pol, s in pols.items():
        for lane in first["mean"]["spend_usd"]:
            role = _role(s, lane)
            moves = lane in s["mean"]["moved_minutes"]
            idle = lane in s["mean"]["asks_after_closure"] and not s["max"]["asks_after_closure"][lane]
            moved = ("no work" if idle else _or(s, "moved_minutes", lane)) if moves else "—"
            wait = ("no work" if idle else _or(s, "move_wait_minutes", lane)) if moves else "—"
            back = (("no work" if idle else _or(s, "back_minutes", lane, digits=0, none="not by the end"))
                    if lane in s["mean"]["back_minutes"] else "—")
            there = _cell(s, "elsewhere_at_closure", lane) if lane in s["mean"]["elsewhere_at_closure"] else "—"
            rows.append([pol, lane, role, there, moved, wait, back, _cell(s, "probes_by_lane", lane),
                         _cell(s, "spend_usd", lane, 2), _cell(s, "other_spend_usd", lane, 2), _cell(s, "done", lane)])
    header = ["policy", "lane", "role", f"running off {keys[0]} at the closure", "moved after the closure, min",
              "from its first ask, min", "admitted again after, min", "its rounds probing", *spend, "done by 00:00"]
    return out + _block(f"{name} — each lane (moved: its first round admitted on the other provider before "
                        f"00:00; admitted again: its first round after the closure, not a probe, anywhere)",
                        header, rows)


def _block(title: str, header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    lines = [title, "  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return lines + [""]


def markdown(doc: dict[str, Any]) -> str:
    """The same table as Markdown (for docs/simulation.md)."""
    out = []
    for block in table(doc).split("\n\n"):
        rows = [l for l in block.splitlines() if l.strip()]
        if len(rows) < 3:
            out.append(block)
            continue
        title, header, _, *body = rows
        cells = [_split(header)] + [_split(r) for r in body]
        n = len(cells[0])
        out.append(f"**{title}**\n")
        out.append("| " + " | ".join(cells[0]) + " |")
        out.append("|" + "---|" * n)
        for c in cells[1:]:
            out.append("| " + " | ".join(c) + " |")
        out.append("")
    return "\n".join(out)


def _split(line: str) -> list[str]:
    import re

    return [c.strip() for c in re.split(r"\s{2,}", line.strip())]


# -- the plots --------------------------------------------------------------------------------
def plots(traces: dict[str, dict[str, Any]], doc: dict[str, Any], directory: str | Path) -> list[Path]:
    """One PNG per scenario: per policy (run 0), rounds in flight and the estimate over time."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - optional extra
        raise RuntimeError("--plots needs matplotlib: pip install 'admission[plots]'") from exc
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, by_policy in traces.items():
        if name in scenarios.DAYS:
            written.append(day_plot(by_policy, doc, directory, plt, name))
            continue
        sc = doc["scenarios"][name]
        pols = [p for p in sc["policies"] if p in by_policy]
        fig, axes = plt.subplots(len(pols), 1, figsize=(11, 2.6 * len(pols)), sharex=True, squeeze=False)
        w0 = scenarios.make(name, doc["config"]["capacity"]).window_start
        for ax, pol in zip(axes[:, 0], pols):
            for i, (pool, pts) in enumerate(by_policy[pol].items()):
                if not pts:
                    continue
                color = f"C{i}"
                t = [(p[0] - w0) / 60.0 for p in pts]
                ax.step(t, [p[1] for p in pts], where="post", color=color, lw=1.2,
                        label=f"in flight {_short(pool)}")
                width = max(len(p[2]) for p in pts)
                for j in range(width):
                    est = [p[2][j] if j < len(p[2]) else math.nan for p in pts]
                    label = ("bound" if pol == "step" else "estimate") + (f" {_short(pool)}" if j == 0 else "")
                    ax.step(t, est, where="post", color=color, lw=0.9, ls="--", alpha=0.8,
                            label=label if j == 0 else None)
                ax.axhline(sc["capacity"][pool], color=color, lw=0.6, ls=":", alpha=0.9)
            ax.set_ylabel("rounds")
            ax.set_title(f"{name} — {pol} (run 0; dotted: K)", fontsize=9, loc="left")
            ax.legend(fontsize=7, loc="upper right", ncol=2)
            ax.set_xlim(left=0 if name != "idle" else -5)  # idle: the burst after idling
        axes[-1, 0].set_xlabel("minutes from the start of the load")
        fig.tight_layout()
        path = directory / f"{name}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    return written


LANE_COLORS = {"express": "C3", "babysitter": "C4", "reviews": "C0", "bugfix": "C1", "triage": "C2"}


def _cumulative(bills: list[tuple[float, str, float]], until: float) -> tuple[list[float], list[float]]:
    """The running total of ``bills`` (t, lane, usd) in UTC hours, up to ``until`` (an hour)."""
    from .day import START_HOUR, hour

    t, y = [START_HOUR], [0.0]
    for when, _, usd in bills:
        if hour(when) >= until:
            break
        t.append(hour(when))
        y.append(y[-1] + usd)
    return t + [until], y + [y[-1]]


def day_plot(by_policy: dict[str, Any], doc: dict[str, Any], directory: Path, plt: Any,
             name: str = "provider-day") -> Path:
    """provider-day (run 0 of each policy): the provider's count of the day's spend, stacked per
    lane, against the key's limit, with the lanes' stops and the closure marked; below it the
    403s per ten minutes (the lanes' rounds and the probes). With a second provider
    (provider-day-fallback): its key's count too (dashed) and where each lane moved (▲)."""
    from .day import START_HOUR, hour

    sc = doc["scenarios"][name]
    keys = [pool.split("@")[-1] for pool in sc["capacity"]]
    pols = [p for p in sc["policies"] if p in by_policy]
    fig, axes = plt.subplots(2 * len(pols), 1, figsize=(12.5, 4.2 * len(pols)), sharex=True, squeeze=False,
                             gridspec_kw={"height_ratios": [3, 1] * len(pols)})
    end = START_HOUR + 16.5
    for i, pol in enumerate(pols):
        tr = by_policy[pol]
        ax, ax403 = axes[2 * i, 0], axes[2 * i + 1, 0]
        midnight = hour(tr["midnight"])
        lanes = list(LANE_COLORS)
        cum = {lane: 0.0 for lane in lanes}
        t, ys = [START_HOUR], {lane: [0.0] for lane in lanes}
        for when, lane, usd in tr["bills"]:
            h = hour(when)
            if h >= midnight:  # the key's count starts again: the day's curve ends at midnight
                break
            cum[lane] = cum.get(lane, 0.0) + usd
            t.append(h)
            for l in lanes:
                ys[l].append(cum.get(l, 0.0))
        t.append(midnight)
        for l in lanes:
            ys[l].append(ys[l][-1])
        ax.stackplot(t, [ys[l] for l in lanes], labels=lanes, colors=[LANE_COLORS[l] for l in lanes], alpha=0.75,
                     step="post")
        limit = tr["limit"]
        ax.axhline(limit, color="k", lw=1.0, ls="--", label=f"key's daily limit {limit:g} $")
        ax.axvline(midnight, color="0.4", lw=0.8, ls=":")
        if tr["reached"] is not None:
            ax.axvline(hour(tr["reached"]), color="k", lw=0.8, label="the key's count reaches the limit")
        for j, (when, why) in enumerate(tr["closures"]):
            ax.axvline(hour(when), color="red", lw=1.2, ls="-.", label=f"provider closed ({why})" if j == 0 else None)
        # the lanes' stops: one marker each; lanes that stopped within ten minutes share a label
        stops = sorted((hour(when), lane, _WHY.get(why, why)) for lane, (when, why) in tr["stops"].items())
        groups: list[list[tuple[float, str, str]]] = []
        for st in stops:
            if groups and st[0] - groups[-1][0][0] < 1 / 6:
                groups[-1].append(st)
            else:
                groups.append([st])
        for j, g in enumerate(groups):
            for h, lane, _ in g:
                ax.plot([h], [limit * 1.03], marker="v", color=LANE_COLORS.get(lane, "k"), ms=7)
            whys = sorted({w for _, _, w in g})
            text = ("every lane" if len(g) == len(LANE_COLORS) else ", ".join(l for _, l, _ in g)) + \
                f" ({'/'.join(whys)}) {_clock(g[0][0])}"
            ax.annotate(text, (g[0][0], limit * (1.08 + 0.075 * (j % 4))), fontsize=7,
                        ha="right" if g[0][0] > 20 else "left",
                        va="bottom", color=LANE_COLORS.get(g[0][1], "k") if len(g) == 1 else "k")
        top = limit * 1.42
        if tr.get("bills_other"):  # the other key's count, and the lanes' moves onto it
            t2, y2 = _cumulative(tr["bills_other"], midnight)
            ax.step(t2, y2, where="post", color="teal", lw=1.6,
                    label=f"{' + '.join(keys[1:])}: the other key's count (every lane)")
            top = max(top, y2[-1] * 1.1)
            for lane, when in sorted(tr.get("moves", {}).items(), key=lambda kv: kv[1]):
                ax.plot([hour(when)], [limit * 0.04], marker="^", color=LANE_COLORS.get(lane, "k"), ms=8,
                        markeredgecolor="k", label=f"{lane} moved {_clock(hour(when))}")
        ax.set_ylim(0, top)
        ax.set_ylabel("USD spent (provider's count)")
        moved = "; ▲ the lane moves" if tr.get("moves") else ""
        on = f" on {keys[0]}'s key" if len(keys) > 1 else ""
        ax.set_title(f"{name} — {pol} (run 0): the day's spend per lane{on}; ▼ the lane stops{moved}",
                     fontsize=9, loc="left")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.005, 1.0))
        # 403s per 10 minutes
        bins = [START_HOUR + k / 6 for k in range(int((end - START_HOUR) * 6) + 1)]
        work = [hour(w) for w, fast, probe in tr["r403"] if not probe]
        probes = [hour(w) for w, fast, probe in tr["r403"] if probe]
        ax403.hist([work, probes], bins=bins, stacked=True, color=["C3", "0.55"],
                   label=["403s of the lanes' rounds", "403s of probes"])
        ax403.axvline(midnight, color="0.4", lw=0.8, ls=":")
        ax403.set_ylabel("403s / 10 min")
        ax403.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.005, 1.0))
    axes[-1, 0].set_xlim(START_HOUR, end)
    top = max(axes[2 * i + 1, 0].get_ylim()[1] for i in range(len(pols)))
    for i in range(len(pols)):  # one scale for the 403s of both policies
        axes[2 * i + 1, 0].set_ylim(0, top)
    ticks = list(range(int(START_HOUR), int(end) + 1, 2))
    axes[-1, 0].set_xticks(ticks)
    axes[-1, 0].set_xticklabels([_clock(h) for h in ticks])
    axes[-1, 0].set_xlabel("UTC (the key resets at 00:00)")
    fig.tight_layout()
    path = directory / f"{name}.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
