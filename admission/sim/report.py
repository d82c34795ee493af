"""The figures of many runs: summaries (mean, min, max), the printed table, the JSON and the
plots (matplotlib is optional: ``pip install admission[plots]``)."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterable

from . import scenarios

SCALARS = ("rate_limited", "cut", "stalled", "red_main_start_minutes", "red_main_behind", "tokens_per_s",
           "sim_minutes")
PER_KEY = ("drain_minutes", "start_minutes", "peak_in_flight", "minutes_above_k", "peak_over_estimate")


def _stats(values: list[float | None]) -> dict[str, Any]:
    got = [v for v in values if v is not None]
    if not got:
        return {"mean": None, "min": None, "max": None, "n": 0}
    return {"mean": sum(got) / len(got), "min": min(got), "max": max(got), "n": len(got)}


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """mean / min / max of every figure over the runs (None where no run has it), with ``n``
    (how many runs have it: a lane that did not drain within the horizon has no drain time)."""
    out: dict[str, Any] = {"mean": {}, "min": {}, "max": {}, "n": {}}
    for name in SCALARS:
        s = _stats([r[name] for r in runs])
        for k in ("mean", "min", "max", "n"):
            out[k][name] = s[k]
    for name in PER_KEY:
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
    return doc


def write_json(doc: dict[str, Any], path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(doc, indent=1, default=float) + "\n")


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
    lines = [f"{cfg['runs']} seeded runs per row (seed {cfg['seed']}), mean [min–max]; K = {cfg['capacity']:g}; "
             f"drain in minutes from the start of the load ('>{horizon:.0f}': not drained within "
             f"{cfg['hours']:g} h)", ""]
    for name, sc in doc["scenarios"].items():
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
