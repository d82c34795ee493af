"""Run the fault suite once and publish its figures.

    .venv/bin/python tests/chaos/report.py            # run, print the tables
    .venv/bin/python tests/chaos/report.py --write    # ... and write both tables into docs/reliability.md
    .venv/bin/python tests/chaos/report.py --soak     # the long runs (ADMISSION_SOAK=1: minutes per fault)

Every figure comes from this one run: the chaos tests, the fuzzing and the TLS and
least-privilege tests record what they measured (tests/figures.py) into one JSON-lines file,
and the tables are rendered from it: the headline (what must be zero, and the heal time) at the
top of docs/reliability.md, between the chaos-headline markers, and every figure under its
Figures, between the chaos-figures markers. A failing test fails the report (nothing is written).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUITE = ["tests/chaos", "tests/test_fuzz.py", "tests/test_distributed_model.py", "tests/test_tls.py",
         "tests/test_deploy.py::test_acl_pod_user_runs_the_rules_and_nothing_else"]
SECTIONS = {
    "pods": "Pods killed and frozen mid-round",
    "restart": "Redis restarts",
    "failover": "Failovers",
    "network": "Lost replies, delays, dropped connections, a partitioned pod",
    "clock": "Clocks",
    "fuzzing": "Fuzzed input",
    "model": "The distributed model",
    "security": "Least privilege and TLS",
}
START, END = "<!-- chaos-figures:start -->", "<!-- chaos-figures:end -->"
HEADLINE_START, HEADLINE_END = "<!-- chaos-headline:start -->", "<!-- chaos-headline:end -->"
PAGE = ROOT / "docs" / "reliability.md"


def run(soak: bool, figures: Path) -> int:
    env = {**os.environ, "ADMISSION_FIGURES": str(figures)}
    if soak:
        env["ADMISSION_SOAK"] = "1"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SUITE]
    print("running:", " ".join(cmd), flush=True)
    return subprocess.call(cmd, cwd=ROOT, env=env)


def _settings(s: dict) -> str:
    """The fault's settings; a breakdown (a dict or a long value) is left to the JSON."""
    return ", ".join(f"{k}={v}" for k, v in sorted(s.items()) if not isinstance(v, dict) and len(str(v)) <= 60)


def _fold_per_command(rows: list[dict]) -> list[dict]:
    """The fuzzers' 'inputs tried, <command>' rows become one row per fuzzer and engine."""
    out, per = [], defaultdict(list)
    for r in rows:
        if r["name"].startswith("inputs tried, ") and r["name"] != "inputs tried, total":
            per[(r["settings"].get("fuzzer"), r["settings"].get("engine"))].append(r["value"])
        else:
            out.append(r)
    for (fuzzer, engine), values in per.items():
        out.append({"section": "fuzzing", "name": f"inputs tried per command ({len(values)} commands), fewest-most",
                    "value": f"{min(values)}-{max(values)}", "unit": "", "must": "",
                    "settings": {"fuzzer": fuzzer, "engine": engine}, "at": 0})
    return out


def render(rows: list[dict], soak: bool) -> str:
    by = defaultdict(list)
    for r in _fold_per_command(rows):
        by[r["section"]].append(r)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(min(r["at"] for r in rows if r["at"])))
    out = [f"From one run of `tests/chaos/report.py{' --soak' if soak else ''}` on {when} "
           f"({platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}).", ""]
    for key in [*SECTIONS, *sorted(set(by) - set(SECTIONS))]:
        if key not in by:
            continue
        out += [f"**{SECTIONS.get(key, key)}**", "", "| figure | value | must be | fault and settings |",
                "|---|---:|---|---|"]
        for r in by[key]:
            value = f"{r['value']} {r['unit']}".strip()
            out.append(f"| {r['name']} | {value} | {r['must'] or ''} | {_settings(r['settings'])} |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def headline(rows: list[dict]) -> str:
    """The headline table: every figure that must be zero, summed per kind, and the heal time."""
    must0 = [r for r in rows if r["must"] == "0"]
    kinds = defaultdict(list)
    for r in must0:
        name = re.sub(r"^[^:]*: ", "", r["name"])
        name = re.sub(r" \(.*\)$", "", name)
        name = re.sub(r"^atheris ", "", name)  # hypothesis and atheris: one row
        kinds[name].append(r)
    out = ["| what an operator fears | measured | faults |", "|---|---:|---|"]
    for name, rs in sorted(kinds.items()):
        total = sum(r["value"] for r in rs if isinstance(r["value"], (int, float)))
        faults = sorted({r["section"] for r in rs})
        out.append(f"| {name} | {total} | {', '.join(faults)} |")
    for r in rows:
        if r["section"] == "pods" and r["name"].startswith("heal time"):
            out.append(f"| {r['name']} | {r['value']} {r['unit']} | lease_ttl {r['settings'].get('lease_ttl_s')} s |")
    return "\n".join(out) + "\n"


def splice(doc: str, text: str, start: str = START, end: str = END, where: object = PAGE) -> str:
    """``doc`` with ``text`` between its ``start`` and ``end`` markers (both must be there)."""
    if start not in doc or end not in doc:
        raise SystemExit(f"{where}: no {start} ... {end} markers to write between")
    head, rest = doc.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{text}{end}{tail}"


def write(path: Path, table: str, head: str) -> None:
    """Both tables into the page: the headline at its top, every figure under Figures."""
    doc = splice(path.read_text(), head, HEADLINE_START, HEADLINE_END, path)
    path.write_text(splice(doc, table, START, END, path))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--soak", action="store_true", help="the long runs (minutes per fault)")
    ap.add_argument("--write", action="store_true", help="write both tables into docs/reliability.md (the headline at its top, every figure below)")
    ap.add_argument("--figures", help="render this JSON-lines file instead of running the suite")
    args = ap.parse_args(argv)
    if args.figures:
        path = Path(args.figures)
    else:
        path = Path(tempfile.mkdtemp(prefix="admission-chaos-")) / "figures.jsonl"
        code = run(args.soak, path)
        if code != 0:
            print(f"the suite failed (exit {code}): nothing written", file=sys.stderr)
            return code
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not rows:
        print("no figures recorded", file=sys.stderr)
        return 1
    table = render(rows, args.soak)
    print(table)
    print(headline(rows))
    if args.write:
        write(PAGE, table, headline(rows))
        print("written: docs/reliability.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
