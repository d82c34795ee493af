"""Plain-text rendering of the census: what an operator reads at a glance."""
from __future__ import annotations

import time
from typing import Any


def _num(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.1f}" if x != int(x) else str(int(x))
    return str(x)


def render_census(doc: dict[str, Any]) -> str:
    """One block per pool (estimate, K, counts, why), one line per lane with work, then starving."""
    lines = [f"mesh {doc.get('mesh')}  policy v{doc.get('configVersion')}  at "
             f"{time.strftime('%H:%M:%S', time.gmtime(doc.get('at', 0)))}Z"]
    for p in doc["pools"]:
        state = f"exhausted ({p['why']})" if p["exhausted"] else "slow start"
        lines.append(f"{p['pool']:<28} K̂ {_num(p['capacity']):>5}  K {_num(p['carryingCapacity']):>4}  "
                     f"slots {p['slots']:>3}  running {p['running']:>3}  waiting {p['waiting']:>3}  "
                     f"free {p['free']:>3}  {state}  ok/fail {_num(p['successes'])}/{_num(p['failures'])}  "
                     f"mean {_num(p['meanSeconds'])}s ${p['meanCostUsd']:.4f}")
        for l in p["lanes"]:
            since = l.get("oldestWaitingSince")
            wait = f"  oldest waiting {doc['at'] - since:.0f}s" if since else ""
            lines.append(f"    {l['lane']:<12} running {l['running']:>3}  waiting {l['waiting']:>3}  "
                         f"guaranteed {l['guaranteed']:>3}  borrowed {l['borrowed']:>3}  bound {l['bound']:>3}  "
                         f"delegated {l['delegated']:>2}  spent today ${l['spentTodayUsd']:.2f}{wait}")
        if p["mustYield"]:
            yielders = ", ".join(f"{y['lane']} ({y['borrowed']})" for y in p["mustYield"])
            lines.append(f"    must yield at their next round: {yielders}; owed {p['owed']}")
    for s in doc["starving"]:
        lines.append(f"STARVING {s['kind']}: lane {s.get('lane')} on {s.get('pool')} waiting since "
                     f"{time.strftime('%H:%M:%S', time.gmtime(s['waitingSince']))}Z")
    return "\n".join(lines)
