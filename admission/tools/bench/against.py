"""``--against``: this checkout's Lua against another Lua folder, side by side in one server."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import redis

from ...client import Admission
from ...core import Usage
from ... import scripts
from ..progress import NoBar, progress_bar
from ..servers import LocalServer
from ..stats import percentile
from .case import _fcall_stats, fill_seats
from .output import report
from .policy import BENCH_CALL, MEASURED_LANE, MESH, POOL


def _library_of(lua: Path) -> tuple[str, str]:
    """(code, version) of the library built from another Lua folder: by that checkout's own
    loader when the folder is a checkout's (its format may be older than this loader's)."""
    tree = lua.resolve().parent
    if (tree / "admission" / "scripts.py").is_file():
        code = "import json, sys; from admission.scripts import library; json.dump(library(), sys.stdout)"
        out = subprocess.run([sys.executable, "-c", code], cwd=tree, check=True, capture_output=True, text=True,
                             env={**os.environ, "ADMISSION_LUA_DIR": str(lua), "PYTHONPATH": str(tree)}).stdout
        built, version = json.loads(out)
        return built, version
    old = os.environ.get("ADMISSION_LUA_DIR")
    os.environ["ADMISSION_LUA_DIR"] = str(lua)
    scripts.library.cache_clear()
    try:
        return scripts.library()
    finally:
        if old is None:
            os.environ.pop("ADMISSION_LUA_DIR", None)
        else:
            os.environ["ADMISSION_LUA_DIR"] = old
        scripts.library.cache_clear()


#: what a ``--ceilings`` release reports the provider counted (less than reserved: a refund)
USAGE = Usage(input_tokens=1_500, cache_read_tokens=400, output_tokens=300)


def run_against(engine: str, other: Path, lanes: Sequence[int], rounds: int, block: int,
                progress: bool | None = None, ceilings: bool = False) -> dict[str, Any]:
    """This Lua against ``other`` in ONE server: both libraries loaded under their versioned names,
    blocks of ``block`` admits (then their releases) alternating between them for ``rounds``
    rounds, the server's µs per call of each block from INFO commandstats. One server and
    alternating blocks put the machine's drift on both alike; the minimum and the lower quintile
    over the blocks are the figures that stand out of a noisy machine's variance.
    ``ceilings``: the pool has a scope of six rate ceilings (``BENCH_CEILINGS``); every admit
    declares a call (``BENCH_CALL``) and every release reconciles its usage. A library older than
    the ceilings reads the same policy and checks none: the difference is the six buckets."""
    this_code, this_version = scripts.library()
    other_code, other_version = _library_of(other)
    if other_version == this_version:
        raise ValueError(f"{other} builds the same library as this checkout ({this_version})")
    versions = {"this": this_version, "other": other_version}
    cases = []
    started = time.perf_counter()
    with LocalServer(engine) as srv, progress_bar(len(lanes) * rounds * 2 * block, progress) as bar:
        setup = redis.Redis.from_url(srv.url)
        adm = Admission(setup, mesh=MESH, pod="bench", background=False, seed=0)
        n = 0
        for n_lanes in sorted(set(lanes)):
            fill_seats(setup, adm, n_lanes, 10, NoBar(), ceilings=ceilings)
            setup.function_load(this_code, replace=True)
            setup.function_load(other_code, replace=True)
            per: dict[str, dict[str, list[float]]] = {k: {"admit": [], "release": []} for k in versions}
            for r in range(rounds):
                for name in (("this", "other") if r % 2 == 0 else ("other", "this")):
                    version = versions[name]
                    calls = []
                    for _ in range(block):
                        n += 1
                        calls.append(adm.core.admit(lane=MEASURED_LANE, model=POOL, round_id=f"ab-{n}", draw=0.5,
                                                    **(BENCH_CALL if ceilings else {})))
                    setup.config_resetstat()
                    seats = [c.decode(setup.execute_command("FCALL", f"adm_admit_{version}", len(c.keys), *c.keys,
                                                            *c.args)).seat for c in calls]
                    per[name]["admit"].append(_usec_per_call(setup))
                    releases = [adm.core.release(seat, outcome="clean", seconds=1.0, cost_usd=0.002,
                                                 usage=USAGE if ceilings else None) for seat in seats]
                    setup.config_resetstat()
                    for c in releases:
                        setup.execute_command("FCALL", f"adm_release_{version}", len(c.keys), *c.keys, *c.args)
                    per[name]["release"].append(_usec_per_call(setup))
                    bar.update(2 * block)
            row: dict[str, Any] = {"lanes": n_lanes}
            for name in versions:
                for kind in ("admit", "release"):
                    xs = sorted(per[name][kind])
                    row[f"{name}_{kind}_min"], row[f"{name}_{kind}_p20"] = xs[0], percentile(xs, 0.2)
            cases.append(row)
        version = srv.version
    return {"engine": engine, "version": version, "this": this_version, "other": other_version,
            "other_dir": str(other), "ceilings": ceilings, "rounds": rounds, "block": block, "cases": cases,
            "elapsed_s": round(time.perf_counter() - started, 1)}


def _usec_per_call(client: redis.Redis) -> float:
    calls, usec = _fcall_stats(client)
    return usec / max(1, calls)


def render_against(result: dict[str, Any], markdown: bool = False) -> str:
    columns = ("lanes", "admit min", "other", "change", "admit p20", "other", "release min", "other", "change",
               "release p20", "other")
    rows = []
    for c in result["cases"]:
        ch = lambda kind: f"{(c[f'this_{kind}_min'] / c[f'other_{kind}_min'] - 1) * 100:+.0f} %"  # noqa: E731
        rows.append([str(c["lanes"]), f"{c['this_admit_min']:.1f}", f"{c['other_admit_min']:.1f}", ch("admit"),
                     f"{c['this_admit_p20']:.1f}", f"{c['other_admit_p20']:.1f}", f"{c['this_release_min']:.1f}",
                     f"{c['other_release_min']:.1f}", ch("release"), f"{c['this_release_p20']:.1f}",
                     f"{c['other_release_p20']:.1f}"])
    head = (f"admission bench --against {result['other_dir']} — {result['engine']} {result['version']}; "
            f"this library {result['this']} against {result['other']}; server µs per call")
    notes = [f"{result['rounds']} rounds of {result['block']} admits then their releases per library, the libraries "
             "alternating in one server; min and p20 over the blocks (INFO commandstats per block)",
             f"whole run {result['elapsed_s']:.0f} s"]
    if result.get("ceilings"):
        notes.insert(1, "--ceilings: the pool's scope has six rate ceilings; each admit declares a call and each "
                        "release reconciles its usage (a library without ceilings checks none)")
    return report(head, columns, rows, notes, markdown)
