"""The doctor: do the counts in Redis agree with the live seat and ticket records?

    report = doctor.check(client, "prod")      # one atomic, read-only call (lua/doctor.lua)
    report.ok, report.problems                  # [{"kind": "lane-count", "pool": ..., ...}, ...]
    print(doctor.render(report))                # "ok: 3 seats, 1 tickets" or the problems

An operator tool and the tests' invariant checker: it costs O(seats + tickets) on the server,
so it is not for a hot path. ``admission doctor`` runs it from the command line.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .core import empty_list


@dataclass(frozen=True)
class Report:
    """What the doctor found: ``ok`` when ``problems`` is empty."""

    ok: bool
    seats: int
    tickets: int
    problems: list[dict[str, Any]] = field(default_factory=list)

    def kinds(self) -> set[str]:
        return {p.get("kind", "?") for p in self.problems}

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "seats": self.seats, "tickets": self.tickets, "problems": list(self.problems)}


def decode(raw: Any) -> Report:
    """The script's JSON reply as a Report (an empty problem list may arrive as ``{}``)."""
    doc = json.loads(raw.decode() if isinstance(raw, bytes) else raw)
    problems = [p for p in empty_list(doc.get("problems")) if isinstance(p, dict)]
    return Report(ok=bool(doc.get("ok")) and not problems, seats=int(doc.get("seats") or 0),
                  tickets=int(doc.get("tickets") or 0), problems=problems)


def check(client: Any, mesh: str) -> Report:
    """Run the doctor on one mesh (sync redis-py client, or a cluster client): ``Mesh.doctor``."""
    from .mesh import Mesh  # the mesh's handle imports this module

    return Mesh(client, mesh=mesh).doctor()


def _detail(p: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(p.items()) if k != "kind")


def render(report: Report, mesh: str | None = None) -> str:
    """Plain text: one ``ok`` line, or a headline and one line per problem."""
    if report.ok:
        return f"ok: {report.seats} seats, {report.tickets} tickets"
    where = f" in mesh {mesh}" if mesh else ""
    n = len(report.problems)
    lines = [f"{n} problem{'s' if n != 1 else ''}{where} ({report.seats} seats, {report.tickets} tickets):"]
    lines += [f"  - {p.get('kind', '?')}: {_detail(p)}" for p in report.problems]
    return "\n".join(lines)
