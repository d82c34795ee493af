"""The report's tables: per fault, per check, and the calls and injections."""
from __future__ import annotations

from typing import Any

from ..tables import table


def _reasons(r: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in r["reasons"].items())


def render(report: dict[str, Any], markdown: bool = False) -> str:
    title = (f"admission fence-report — {report['intents']:,} intents per fault, seed {report['seed']}, "
             f"injected share {report['share']:g} (redis-unreachable: all); {report['server']}; "
             f"Python {report['python']}, {report['machine']}; {report['seconds']:.1f} s")
    head = ["fault", "intents", "injected", "admitted", "shed", "shed/100 intents", "shed/100 injected",
            "primary unchanged on shed", "decisions by reason"]
    rows = []
    for f in report["faults"]:
        inv = f["invariant"]
        mark = "✓" if inv["ok"] else "✗"
        rows.append([f["fault"], f"{f['intents']:,}", f"{f['injected']:,}", f"{f['admitted']:,}", f"{f['shed']:,}",
                     f"{f['shedPer100']:.1f}", f"{f['shedPer100Injected']:.1f}",
                     f"{inv['held']:,}/{inv['cases']:,} {mark}", _reasons(f)])
    out = [("**" + title + "**") if markdown else title, ""]
    out += table(head, rows, markdown, right={1, 2, 3, 4, 5, 6, 7}, rule=False)
    out += ["", "**checks** (held/cases)" if markdown else "checks (held/cases):", ""]
    chead = ["fault", "check", "held/cases"]
    crows = []
    for f in report["faults"]:
        for name, c in f["checks"].items():
            crows.append([f["fault"], name, f"{c['held']:,}/{c['cases']:,} {'✓' if c['ok'] else '✗'}"])
    out += table(chead, crows, markdown, right={2}, rule=False)
    calls = [[f["fault"], ", ".join(f"{k} {v:,}" for k, v in f["calls"].items())] for f in report["faults"]]
    out += ["", "**calls and injections**" if markdown else "calls and injections:", ""]
    out += table(["fault", "counts"], calls, markdown, right=set(), rule=False)
    failed = [(f["fault"], name) for f in report["faults"] for name, c in f["checks"].items() if not c["ok"]]
    out.append("")
    if failed:
        out.append("FAILED: " + "; ".join(f"{fault}: {name}" for fault, name in failed))
        for f in report["faults"]:
            out += [f"  {d}" for d in f["failures"]]
    else:
        out.append("every check held in every case: the primary was unchanged across every shed borrow")
    for f in report["faults"]:
        out += [("- " if markdown else "") + f"note ({f['fault']}): {n}" for n in f["notes"]]
    return "\n".join(out)
