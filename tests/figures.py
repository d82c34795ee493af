"""Figures that a test measured, collected into one JSON report for docs/reliability.md.

A test calls `record(section, name, value, settings=...)`. When ADMISSION_FIGURES names a file,
each call appends one JSON line to it (several processes may write: one line per write, in
append mode); otherwise nothing is written and the call only returns the value. The chaos
report (`.venv/bin/python tests/chaos/report.py`, docs/reliability.md) runs the suite once
with ADMISSION_FIGURES set and renders the tables from that one run.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any


def record(section: str, name: str, value: Any, *, unit: str = "", must: str = "",
           settings: dict[str, Any] | None = None) -> Any:
    """Note a measured figure. `must` states what it has to be (e.g. "0"), `settings` the fault
    and its parameters, so the published row names both."""
    path = os.environ.get("ADMISSION_FIGURES")
    if path:
        line = json.dumps({"section": section, "name": name, "value": value, "unit": unit,
                           "must": must, "settings": settings or {}, "at": time.time()},
                          sort_keys=True, default=str)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
    return value


def soak() -> bool:
    """ADMISSION_SOAK=1: the long runs (minutes per fault instead of seconds)."""
    return os.environ.get("ADMISSION_SOAK", "").strip() not in ("", "0", "false", "no")
