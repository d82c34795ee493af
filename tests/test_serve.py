"""`admission serve`: /healthz, /readyz, /census.json, /metrics (parsed with prometheus_client's
parser) and the live page, rendered by the server and refreshed by its script in a real
headless Chromium (the distribution's /usr/bin/chromium)."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import urllib.error
import urllib.request
from contextlib import contextmanager
from html.parser import HTMLParser
from pathlib import Path

import pytest

pytest.importorskip("prometheus_client", reason="the serve extra: pip install 'admission[serve]'")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from admission import serve  # noqa: E402
from conftest import REAL  # noqa: E402
from helpers import POOL, adm, policy  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
SECRET = "round-secret"  # every round id starts so: no label may hold one


@contextmanager
def serving(redis_or_url, meshes=("t",), cache_seconds=0.0):
    srv = serve.make_server(redis_or_url, list(meshes), "127.0.0.1", 0, cache_seconds=cache_seconds)
    th = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    th.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", srv
    finally:
        srv.shutdown()
        srv.server_close()
        th.join(5)


def get(url: str, accept: str | None = None) -> tuple[int, dict[str, str], str]:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


def samples(text: str) -> dict[str, list]:
    """Sample name -> its samples, every family checked against the naming rules on the way."""
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        assert fam.name.startswith("admission_"), fam.name
        for s in fam.samples:
            if fam.type == "counter":
                assert s.name == fam.name + "_total" or s.name.endswith("_created"), s.name
            assert not any(SECRET in v for v in s.labels.values()), s  # no round id as a label
            out.setdefault(s.name, []).append(s)
    return out


def value(found: dict[str, list], name: str, **labels: str) -> float:
    hits = [s.value for s in found.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(hits) == 1, (name, labels, found.get(name))
    return hits[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ask(a, lane: str, n: int, wait: bool = False):
    return [a.try_admit(lane=lane, model=POOL, round_id=f"{SECRET}-{lane}-{i}", wait=wait) for i in range(n)]


# -- endpoints ----------------------------------------------------------------------------------


def test_health_ready_and_census_json(redis_client):
    with serving(redis_client) as (base, _srv):
        assert get(base + "/healthz")[::2] == (200, "ok\n")
        status, _, body = get(base + "/readyz")
        assert (status, body) == (503, "no policy applied to mesh t\n")
        status, headers, body = get(base + "/census.json")
        assert status == 503 and headers["Content-Type"] == "application/json"
        assert "no policy" in json.loads(body)["error"]
        found = samples(get(base + "/metrics")[2])
        assert value(found, "admission_census_up", mesh="t") == 0
        assert "admission_pool_running" not in found

        a = adm(redis_client)
        assert [d.admitted for d in ask(a, "a", 2)] == [True, True]
        assert get(base + "/readyz")[::2] == (200, "ready: mesh t policy v1\n")
        assert get(base + "/healthz")[0] == 200
        status, headers, body = get(base + "/census.json")
        doc = json.loads(body)
        assert status == 200 and headers["Cache-Control"] == "no-store"
        assert doc["mesh"] == "t" and doc["configVersion"] == 1
        row = next(p for p in doc["pools"] if p["pool"] == POOL)
        assert row["running"] == 2 and [l["lane"] for l in row["lanes"]] == ["a"]
        assert get(base + "/nope")[0] == 404
        assert get(base + "/census.json?mesh=other")[0] == 404


def test_redis_down_is_not_ready_but_alive():
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    with serving(url) as (base, _srv):
        assert get(base + "/healthz")[::2] == (200, "ok\n")
        status, _, body = get(base + "/readyz")
        assert status == 503 and body.startswith("redis unreachable") and body.count("\n") == 1
        status, _, body = get(base + "/census.json")
        assert status == 503 and json.loads(body)["error"].startswith("redis unreachable")
        found = samples(get(base + "/metrics")[2])
        assert value(found, "admission_census_up", mesh="t") == 0
        status, _, page = get(base + "/")
        assert status == 200 and "census unavailable: redis unreachable" in page
        assert Dom(page).one("span", id="updated")["attrs"]["class"] == "stale"


def test_metrics_from_the_census_and_the_totals(redis_client):
    pol = policy()
    pol["providers"]["p"]["daily_limit_usd"] = 50
    a = adm(redis_client, pol=pol)
    seats = [d.seat for d in ask(a, "a", 3)]
    a.release(seats[0], outcome="clean", seconds=2.0, cost_usd=1.25)
    refused = a.try_admit(lane="b", model=POOL, round_id=f"{SECRET}-b-w", wait=True, draw=0.999)
    with serving(redis_client) as (base, _srv):
        found = samples(get(base + "/metrics")[2])
        doc = json.loads(get(base + "/census.json")[2])
        row = next(p for p in doc["pools"] if p["pool"] == POOL)
        pool = {"mesh": "t", "pool": POOL, "provider": "p"}
        assert value(found, "admission_census_up", mesh="t") == 1
        assert 0 <= value(found, "admission_census_age_seconds", mesh="t") < 5
        assert value(found, "admission_policy_version", mesh="t") == 1
        for name, field in (("estimate", "capacity"), ("carrying_capacity", "carryingCapacity"), ("slots", "slots"),
                            ("running", "running"), ("waiting", "waiting"), ("free", "free")):
            assert value(found, f"admission_pool_{name}", **pool) == row[field], name
        assert value(found, "admission_pool_running", **pool) == 2
        assert value(found, "admission_pool_waiting", **pool) == (0 if refused.admitted else 1)
        assert value(found, "admission_pool_exhausted", **pool) == 0
        assert value(found, "admission_pool_closed", **pool) == 0
        assert value(found, "admission_pool_moved_in_total", **pool) == 0
        assert value(found, "admission_pool_mean_round_cost_usd", **pool) == pytest.approx(1.25)
        assert value(found, "admission_budget_limit_usd", mesh="t", provider="p") == 50
        assert value(found, "admission_budget_spent_usd", mesh="t", provider="p") == pytest.approx(1.25)
        lane_a = {"mesh": "t", "pool": POOL, "lane": "a"}
        lane_row = next(l for l in row["lanes"] if l["lane"] == "a")
        for name in ("running", "waiting", "guaranteed", "borrowed"):
            assert value(found, f"admission_lane_{name}", **lane_a) == lane_row[name], name
        assert value(found, "admission_lane_spent_today_usd", **lane_a) == pytest.approx(1.25)
        assert value(found, "admission_lane_reserve_left_usd", **lane_a) == pytest.approx(lane_row["reserveLeftUsd"])
        # whatever the scripts counted in the totals hash is exposed as it is
        key = serve.totals_key("t")
        counted = {k.decode(): int(v) for k, v in redis_client.hgetall(key).items()}
        names = {"admitted": "admitted", "refused": "refused", "signal": "signals", "closed": "closures",
                 "reopened": "reopens", "probe": "probes", "moved": "moves"}
        for field, n in counted.items():
            kind, *parts = field.split("|")
            labels = dict(zip(serve.TOTALS[kind][1], parts))
            assert value(found, f"admission_{names[kind]}_total", mesh="t", **labels) == n, field
        # an empty hash: the counters are declared and hold no sample
        redis_client.delete(key)
        found = samples(get(base + "/metrics")[2])
        for name in names.values():
            assert f"admission_{name}_total" not in found, name

        for field, n in (("admitted|m@p|a|within-floor", 2), ("admitted|m@p|a|borrowed", 1),
                         ("refused|m@p|b|full", 4), ("signal|m@p|rate_limited", 3), ("closed|p|key_daily_limit", 1),
                         ("reopened|p|probe", 1), ("probe|m@p", 2), ("moved|m@p|n@q", 5),
                         ("admitted|m@p|a", 9), ("sideways|m@p", 9), ("probe|", 9)):  # the last three: malformed
            redis_client.hincrby(key, field, n)
        redis_client.hset(key, "probe|x@y", "not-a-number")
        found = samples(get(base + "/metrics")[2])
        assert value(found, "admission_admitted_total", mesh="t", pool=POOL, lane="a", reason="within-floor") == 2
        assert value(found, "admission_admitted_total", mesh="t", pool=POOL, lane="a", reason="borrowed") == 1
        assert len(found["admission_admitted_total"]) == 2
        assert value(found, "admission_refused_total", mesh="t", pool=POOL, lane="b", reason="full") == 4
        assert value(found, "admission_signals_total", mesh="t", pool=POOL, signal="rate_limited") == 3
        assert value(found, "admission_closures_total", mesh="t", provider="p", why="key_daily_limit") == 1
        assert value(found, "admission_reopens_total", mesh="t", provider="p", by="probe") == 1
        assert [s.labels for s in found["admission_probes_total"]] == [{"mesh": "t", "pool": POOL}]
        assert value(found, "admission_moves_total", mesh="t", from_pool=POOL, to_pool="n@q") == 5

        # OpenMetrics when the scraper asks for it
        status, headers, body = get(base + "/metrics", accept="application/openmetrics-text; version=1.0.0")
        assert status == 200 and headers["Content-Type"].startswith("application/openmetrics-text")
        assert body.rstrip().endswith("# EOF") and 'admission_moves_total{' in body


def test_a_burst_of_scrapes_rebuilds_the_census_once(redis_client):
    adm(redis_client)
    with serving(redis_client, cache_seconds=1.0) as (base, srv):
        source, calls = srv.source, []
        real = source.adms["t"].census
        source.adms["t"].census = lambda *a, **k: (calls.append(1), real(*a, **k))[1]
        now = [1000.0]
        source.clock = lambda: now[0]
        threads = [threading.Thread(target=get, args=(base + path,)) for path in ("/metrics", "/census.json", "/") * 4]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(calls) == 1
        now[0] += 1.5  # the cache's second has passed
        get(base + "/census.json")
        assert len(calls) == 2


def test_several_meshes(redis_client):
    adm(redis_client, mesh="a")
    with serving(redis_client, meshes=("a", "b")) as (base, _srv):
        assert get(base + "/readyz")[0] == 200  # the first mesh by default
        assert get(base + "/readyz?mesh=b")[::2] == (503, "no policy applied to mesh b\n")
        found = samples(get(base + "/metrics")[2])
        assert value(found, "admission_census_up", mesh="a") == 1
        assert value(found, "admission_census_up", mesh="b") == 0

        adm(redis_client, mesh="b", pol=policy(pools=("x@q",)))
        assert get(base + "/readyz?mesh=b")[0] == 200
        assert json.loads(get(base + "/census.json")[2])["mesh"] == "a"
        assert json.loads(get(base + "/census.json?mesh=b")[2])["pools"][0]["pool"] == "x@q"
        found = samples(get(base + "/metrics")[2])
        assert {s.labels["mesh"] for s in found["admission_pool_slots"]} == {"a", "b"}
        assert value(found, "admission_pool_slots", mesh="b", pool="x@q", provider="q") >= 1
        only_b = samples(get(base + "/metrics?mesh=b")[2])
        assert {s.labels["mesh"] for s in only_b["admission_pool_slots"]} == {"b"}
        assert get(base + "/metrics?mesh=c")[0] == 404
        page = Dom(get(base + "/?mesh=b")[2])
        assert page.one("body")["attrs"]["data-mesh"] == "b"
        assert page.one("tr", within=page.one("table", id="pools"), data_pool="x@q")
        assert [x["attrs"]["href"] for x in page.all("a", within=page.one("nav"))] == ["?mesh=a", "?mesh=b"]


def test_real_server_from_a_url(server_url):
    import redis

    a = adm(redis.Redis.from_url(server_url))
    ask(a, "a", 1)
    with serving(server_url) as (base, _srv):
        assert get(base + "/readyz")[0] == 200
        found = samples(get(base + "/metrics")[2])
        assert value(found, "admission_pool_running", mesh="t", pool=POOL, provider="p") == 1
        status, headers, page = get(base + "/")
        assert status == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
        dom = Dom(page)
        assert dom.one("tr", within=dom.one("table", id="pools"), data_pool=POOL)


# -- the command --------------------------------------------------------------------------------

# `admission serve` as cli.py wires it: add_parser on the subcommands, then args.func(args)
CLI = ("import argparse, sys\n"
       "from admission import serve\n"
       "p = argparse.ArgumentParser(prog='admission')\n"
       "serve.add_parser(p.add_subparsers(dest='command', required=True))\n"
       "args = p.parse_args(sys.argv[1:])\n"
       "sys.exit(args.func(args))\n")


def parse(*argv: str):
    import argparse

    p = argparse.ArgumentParser(prog="admission")
    serve.add_parser(p.add_subparsers(dest="command", required=True))
    return p.parse_args(list(argv))


def test_cli_arguments(monkeypatch):
    """The global --url/--mesh (and their environment variables) apply to serve unless it names its own."""
    from admission.cli import build_parser

    monkeypatch.delenv("ADMISSION_URL", raising=False)
    monkeypatch.delenv("ADMISSION_MESH", raising=False)
    args = build_parser().parse_args(["serve"])
    assert (args.url, args.host, args.port, args.func) == ("redis://127.0.0.1:6379/0", "127.0.0.1", 9464, serve.run_cli)
    args = build_parser().parse_args(["--url", "redis://h:1/0", "serve", "--mesh", "a", "b", "--mesh", "c"])
    assert (args.url, args.mesh) == ("redis://h:1/0", ["a", "b", "c"])
    monkeypatch.setenv("ADMISSION_URL", "redis://env:2/0")
    assert build_parser().parse_args(["serve"]).url == "redis://env:2/0"
    assert serve.redact("redis://user:pw@h:1/0") == "redis://user:***@h:1/0"
    assert serve.redact("redis://h:1/0") == "redis://h:1/0"


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_cli_serves_until_interrupted(server_url, sig):
    import signal
    import sys

    port = free_port()
    # a shell's background job (a CI runner's `pytest &`) starts with SIGINT ignored, which its
    # children inherit: the server gets the default disposition, as a foreground command has
    proc = subprocess.Popen([sys.executable, "-c", CLI, "serve", "--url", server_url, "--mesh", "t", "--port",
                             str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        line = proc.stdout.readline()
        assert line.startswith(f"admission serve: http://127.0.0.1:{port}/ (meshes t; redis "), line
        assert get(f"http://127.0.0.1:{port}/healthz")[::2] == (200, "ok\n")
        assert get(f"http://127.0.0.1:{port}/readyz")[0] == 503  # no policy yet: alive, not ready
        proc.send_signal(getattr(signal, sig))
        assert proc.wait(timeout=10) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cli_one_line_errors(monkeypatch, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert serve.run_cli(parse("serve", "--port", str(port))) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"admission serve: cannot listen on 127.0.0.1:{port}: ") and err.count("\n") == 1
    assert serve.run_cli(parse("serve", "--mesh", "no{braces}")) == 2
    err = capsys.readouterr().err
    assert err.startswith("admission serve: BadName: ") and err.count("\n") == 1

    def missing():
        raise serve.MissingExtra("prometheus_client is not installed (No module named 'prometheus_client'); "
                                 "pip install 'admission[serve]'")

    monkeypatch.setattr(serve.metrics, "prometheus", missing)
    assert serve.run_cli(parse("serve", "--port", "0")) == 2
    err = capsys.readouterr().err
    assert "pip install 'admission[serve]'" in err and err.count("\n") == 1


def test_missing_extra_is_one_line(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_prometheus(name, *a, **k):
        if name.startswith("prometheus_client"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_prometheus)
    with pytest.raises(serve.MissingExtra, match=r"pip install 'admission\[serve\]'"):
        serve.prometheus()


# -- the page -----------------------------------------------------------------------------------


def test_page_is_server_rendered_and_escaped(redis_client):
    evil = '<img src=x onerror="alert(1)">'
    doc = {"mesh": "t", "at": 1_800_000_000, "configVersion": 3, "pools": [
        {"pool": evil, "provider": "p&q", "capacity": 4.5, "carryingCapacity": 8, "slots": 4, "running": 1,
         "waiting": 2, "free": 3, "exhausted": True, "why": "</script><script>alert(2)</script>",
         "closedUntil": 1_800_003_600, "closedWhy": "key_daily_limit", "budgetLimitUsd": 10.0,
         "budgetSpentUsd": 2.5, "committedUsd": 0.5, "owed": 1,
         "lanes": [{"lane": "l'1", "running": 1, "waiting": 2, "guaranteed": 1, "borrowed": 0, "bound": 1,
                    "delegated": 0, "spentTodayUsd": 2.5, "reserveLeftUsd": None,
                    "oldestWaitingSince": 1_799_999_990}],
         "mustYield": [{"lane": "l'1", "borrowed": 1}]}],
        "starving": [{"kind": "provider-closed", "provider": "p&q", "pool": evil, "why": "key_daily_limit",
                      "closedUntil": 1_800_003_600, "waiting": 2}]}
    page = serve.render_page("t", ["t"], doc, nonce="n0nce")
    assert "<img" not in page and "<script>alert" not in page and page.count("</script>") == 2
    dom = Dom(page)
    assert dom.one("tr", within=dom.one("table", id="pools"), data_pool=evil)["text"].startswith(evil + "p&q4.58")
    assert dom.one("li", within=dom.one("ul", id="starving"), data_kind="provider-closed")
    assert dom.one("li", within=dom.one("ul", id="must-yield"), data_lane="l'1")
    assert dom.one("tr", within=dom.one("table", id="providers"), data_provider="p&q")["attrs"]["class"] == "closed"
    assert "$2.50 + $0.50 in flight of $10.00 (left $7.00)" in page
    assert all(x["attrs"].get("nonce") == "n0nce" for x in dom.all("script") + dom.all("style"))
    assert json.loads(dom.one("script", id="initial")["text"])["census"] == doc

    adm(redis_client)
    with serving(redis_client) as (base, _srv):
        status, headers, body = get(base + "/")
        nonce = Dom(body).one("script", id="initial")["attrs"]["nonce"]
        assert f"script-src 'nonce-{nonce}'" in headers["Content-Security-Policy"]
        dom = Dom(body)  # no external assets: no linked script, style sheet or image; relative links only
        assert not any("src" in x["attrs"] for x in dom.elements) and not dom.all("link")
        assert all("//" not in x["attrs"].get("href", "") for x in dom.all("a"))


needs_chromium = pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK),
                                    reason=f"{CHROMIUM} not installed (apt-get install chromium; CI installs it)")


def chromium(url: str, tmp: Path, *extra: str) -> subprocess.CompletedProcess:
    profile = tmp / f"profile-{len(list(tmp.glob('profile-*')))}"
    return subprocess.run([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           f"--user-data-dir={profile}", "--virtual-time-budget=5000", *extra, url],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "HOME": str(tmp)})


@needs_chromium
@pytest.mark.parametrize("engine", [REAL[0] if REAL else "fakeredis"], indirect=True)
def test_live_page_in_chromium(redis_client, tmp_path):
    a = adm(redis_client)
    decisions = ask(a, "a", 2)
    assert all(d.admitted for d in decisions)
    a.report(decisions[0].seat, signal="rate_limited")  # exhausted: K is measured, K̂ drops
    with serving(redis_client) as (base, _srv):
        run = chromium(base + "/", tmp_path, "--dump-dom")
        assert run.returncode == 0, run.stderr[-2000:]
        dom = Dom(run.stdout)
        updated = dom.one("span", id="updated")["attrs"]
        assert updated["data-source"] == "script" and int(updated["data-polls"]) >= 1, updated  # the script ran
        pools = dom.one("table", id="pools")
        assert pools["attrs"]["data-source"] == "script"  # ... and rendered the tables again
        row = dom.one("tr", within=pools, data_pool=POOL)
        assert row["attrs"]["class"] == "exhausted" and "exhausted (rate_limited)" in row["text"]
        assert dom.one("polyline", within=row, **{"class": "k-est"})  # K̂ and K over time
        assert dom.one("polyline", within=row, **{"class": "k-cap"})
        assert dom.one("tr", within=dom.one("table", id="lanes"), data_pool=POOL, data_lane="a")
        assert not dom.all("li", within=dom.one("ul", id="starving"), data_kind="provider-closed")
        assert dom.one("ul", id="must-yield")

        shot = tmp_path / "census.png"
        run = chromium(base + "/", tmp_path, f"--screenshot={shot}", "--window-size=1280,900")
        assert run.returncode == 0, run.stderr[-2000:]
        png = shot.read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
        if os.environ.get("ADMISSION_SCREENSHOT_DIR"):  # keep it for a person (CI artifact)
            shutil.copy(shot, Path(os.environ["ADMISSION_SCREENSHOT_DIR"]) / "census.png")

        a.ops.close_provider("p", why="test")
        waiter = a.try_admit(lane="b", model=POOL, round_id=f"{SECRET}-b-w", wait=True)
        assert not waiter.admitted and waiter.reason == "provider-closed"
        run = chromium(base + "/", tmp_path, "--dump-dom")
        assert run.returncode == 0, run.stderr[-2000:]
        dom = Dom(run.stdout)
        starving = dom.one("ul", id="starving")
        assert starving["attrs"]["data-source"] == "script"
        entry = dom.one("li", within=starving, data_kind="provider-closed")
        assert entry["attrs"]["data-pool"] == POOL and "provider p closed (operator:test)" in entry["text"]
        assert dom.one("tr", within=dom.one("table", id="pools"), data_pool=POOL)["attrs"]["class"] == "closed"
        assert dom.one("tr", within=dom.one("table", id="providers"), data_provider="p")["attrs"]["class"] == "closed"


# -- a small DOM over html.parser ---------------------------------------------------------------


class Dom(HTMLParser):
    VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.stack: list[dict] = []
        self.elements: list[dict] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        el = {"tag": tag, "attrs": {k: v or "" for k, v in attrs}, "parents": list(self.stack), "text": ""}
        self.elements.append(el)
        if tag not in self.VOID:
            self.stack.append(el)

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i]["tag"] == tag:
                del self.stack[i:]
                return

    def handle_data(self, data):
        for el in self.stack:
            el["text"] += data

    def all(self, tag: str, within: dict | None = None, **attrs: str) -> list[dict]:
        want = {k.replace("_", "-"): v for k, v in attrs.items()}
        return [el for el in self.elements if el["tag"] == tag
                and (within is None or any(p is within for p in el["parents"]))
                and all(el["attrs"].get(k) == v for k, v in want.items())]

    def one(self, tag: str, within: dict | None = None, **attrs: str) -> dict:
        found = self.all(tag, within, **attrs)
        assert len(found) == 1, (tag, attrs, len(found))
        return found[0]
