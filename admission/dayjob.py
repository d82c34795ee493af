"""The provider's day, for operators: the budget readers the policy names, and the midnight
roll-over (``admission budget sync`` and ``admission day-rollover``; a Kubernetes CronJob runs
the latter at 00:00 UTC, see ``deploy/``).

A roll-over is safe to run late, twice or not at all: every day-scoped thing is keyed by its
UTC day and a closure expires by itself at its ``closedUntil``. It refreshes the budget readings
first (a key topped up overnight is learned before the first round of the day), then runs the
``rollover`` script once for the day.
"""
from __future__ import annotations

import os
from typing import Any, Mapping

from ._log import get_logger
from .budget import BudgetReader, OpenRouterKeyReader, Reading, read_all
from .core import Rollover

log = get_logger("admission.dayjob")


def readers_from_policy(policy: Mapping[str, Any], env: Mapping[str, str] | None = None) -> list[BudgetReader]:
    """The budget readers of the policy's providers (``budget_reader = "openrouter"``, its
    ``budget_url`` and the environment variable holding its key). A provider whose key is not in
    the environment is skipped with a warning: no reading, never a closure."""
    env = os.environ if env is None else env
    readers: list[BudgetReader] = []
    for name, p in sorted((policy.get("providers") or {}).items()):
        if p.get("budget_reader") != "openrouter":
            continue
        key = env.get(p["api_key_env"], "")
        if not key:
            log.warning("budget_reader_without_key", provider=name, env=p["api_key_env"])
            continue
        readers.append(OpenRouterKeyReader(name, p["budget_url"], key))
    return readers


def sync_budgets(mesh: Any, readers: list[BudgetReader] | None = None, now: float | None = None) -> list[Reading]:
    """Run the readers once and store every reading they gave (a failing reader is skipped).
    ``mesh``: the mesh's ``Mesh`` handle."""
    readers = readers_from_policy(mesh.policy()) if readers is None else readers
    readings = read_all(readers)
    for reading in readings:
        mesh.report_budget(reading, now=now)
    return readings


def day_rollover(mesh: Any, readers: list[BudgetReader] | None = None,
                 now: float | None = None) -> tuple[Rollover, list[Reading]]:
    """Refresh the budget readings, then roll the day over (once per UTC day)."""
    readings = sync_budgets(mesh, readers, now)
    return mesh.rollover(now), readings
