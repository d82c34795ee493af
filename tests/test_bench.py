"""Smoke test of the benchmark (python -m admission.tools.bench): it runs and prints its figures.

Not a timing assertion: the figures depend on the machine; only their presence is checked.
"""
from __future__ import annotations

import json

import pytest

from admission.tools import bench
from admission.tools.servers import available_engines

ENGINE = next(iter(available_engines()), None)
pytestmark = [pytest.mark.real,
              pytest.mark.skipif(ENGINE is None, reason="no redis-server / valkey-server available")]


def test_bench_quick_prints_the_figures(capsys, tmp_path):
    out_json = tmp_path / "bench.json"
    rc = bench.main(["--quick", "--engine", ENGINE, "--lanes", "1,7", "--seats", "3,20", "--waiters", "0,5",
                     "--iterations", "25", "--pods", "2", "--no-progress", "--json", str(out_json)])
    assert rc == 0
    out = capsys.readouterr().out
    for words in ("admit−PING p50", "release−PING p50", "floor−PING p50", "PING p50", "server admit",
                  "server release", "server floor", "vs smallest", "target: admit−PING p50 ≤ 40 µs",
                  "target: release−PING p50 ≤ 40 µs", "target: server admit ≤ 30 µs", "flat in seats and waiters",
                  "2 pod processes", "decisions/s"):
        assert words in out, f"{words!r} missing from:\n{out}"
    result = json.loads(out_json.read_text())
    assert result["engine"] == ENGINE and result["version"]
    cases = result["cases"]
    assert [(c["lanes"], c["seats"], c["waiters"]) for c in cases] == [
        (l, s, w) for l in (1, 7) for s in (3, 20) for w in (0, 5)]
    for c in cases:
        assert c["iterations"] == 25
        assert c["admit_p50"] > 0 and c["release_p50"] > 0 and c["ping_p50"] > 0 and c["floor_p50"] > 0
        assert c["admit_p99"] >= c["admit_p50"] and c["admit_extra_p99"] >= c["admit_extra_p50"]
        assert c["server_admit_usec"] > 0 and c["server_release_usec"] > 0 and c["server_floor_usec"] > 0
        assert c["server_calls"] == 2 * 25  # the server blocks: 25 admits, then their releases (refills apart)
        assert c["reasons"] == {"within-floor": 25}  # the measured path is the same in every case
    smallest = [c for c in cases if c["seats"] == 3 and c["waiters"] == 0]
    assert all(c["vs_smallest"] == pytest.approx(1.0) for c in smallest)
    assert result["pods"]["pods"] == 2 and result["pods"]["decisions"] > 0
    # one printed row per case
    assert sum(1 for line in out.splitlines() if line.strip().startswith(("1 ", "7 "))) == len(cases)

    md = bench.render(result, markdown=True)
    rows = [line for line in md.splitlines() if line.startswith("| ")]
    assert len(rows) == 1 + len(cases)  # header + one per case
    assert rows[0].startswith("| lanes | seats | waiters | admit−PING p50")
    assert "admit ÷ floor" in rows[0]
    ratios = result["targets"]["lanes_median_admit_over_floor"]
    assert set(ratios) == {"1", "7"} and all(r > 0 for r in ratios.values())
    assert "admit ÷ floor = the server's µs per admit over the floor's" in out


def test_the_floor_function_leaves_the_mesh_untouched():
    """The floor writes only floor:* keys: the mesh's seats, counts and ledger are as they were."""
    from admission.tools.servers import LocalServer
    import redis

    with LocalServer(ENGINE) as srv:
        c = redis.Redis(port=srv.port)
        from admission import Admission

        adm = Admission(c, mesh=bench.MESH, pod="bench", background=False)
        adm.ops.apply_policy(bench.bench_policy(7, 100), recovery_hold=False)
        before = {k: c.type(k) for k in c.keys("*")}
        c.function_load(bench.FLOOR_LIBRARY, replace=True)
        reply = bench.floor(c, adm.core.config_key, "f-1", bench.lane_fields(7))
        assert reply[0] == 1 and reply[1] == b"within-floor"
        after = {k: c.type(k) for k in c.keys("*") if b":floor:" not in k}
        assert after == before


def test_lanes_table_floors():
    for n in (1, 7, 8, 32):
        lanes = bench.lanes_table(n)
        assert len(lanes) == n and bench.MEASURED_LANE in lanes
        assert sum(l["floor"] for l in lanes.values()) <= 1 + 1e-9


def test_against_times_two_libraries_side_by_side(capsys, tmp_path):
    import shutil

    from admission._paths import lua_dir

    other = tmp_path / "lua"
    shutil.copytree(lua_dir(), other)
    (other / "admit.lua").write_text((other / "admit.lua").read_text() + "\n-- another version\n")
    assert bench.main(["--against", str(other), "--quick", "--engine", ENGINE, "--lanes", "1", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "admit min" in out and "release min" in out and "change" in out
    row = next(line for line in out.splitlines() if line.strip().startswith("1 "))
    assert len(row.split()) == 13  # lanes, 4 admit figures + change (2 words), 4 release figures + change


def test_against_refuses_a_folder_without_the_lua(tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--against", str(tmp_path), "--engine", ENGINE])
    assert "holds no admit.lua" in capsys.readouterr().err


def test_against_with_ceilings_debits_six_buckets_and_reconciles(tmp_path, capsys):
    """``--against --ceilings``: the policy gives the pool a scope of the six ceilings, every admit
    declares a call and every release its usage (a bad one would be refused: the run would fail),
    and the table says what was measured."""
    import shutil

    from admission._paths import lua_dir
    from admission.tools.bench import against
    from admission.tools.bench.policy import BENCH_CEILINGS, POOL, bench_policy

    other = tmp_path / "lua"
    shutil.copytree(lua_dir(), other)
    (other / "admit.lua").write_text((other / "admit.lua").read_text() + "\n-- another version\n")
    result = against.run_against(str(ENGINE), other, [1], 2, 5, progress=False, ceilings=True)
    assert bench_policy(1, 2, ceilings=True)["pools"][POOL]["ceilings"] == "bench"
    assert result["ceilings"] is True and set(BENCH_CEILINGS) == {"rpm", "tpm", "itpm", "otpm", "rpd", "tpd"}
    assert "six rate ceilings" in against.render_against(result)
    assert bench.main(["--against", str(other), "--ceilings", "--quick", "--engine", ENGINE, "--lanes", "1",
                       "--no-progress"]) == 0
    assert "--ceilings" in capsys.readouterr().out
