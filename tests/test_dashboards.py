"""What operators import: the Grafana dashboard and the Prometheus alerts of deploy/.

* every metric a dashboard query or an alert expression names is one a live `admission serve`
  exports (started here as a process over a real Redis, a policy applied and rounds run) or a
  live pod's own /metrics does (``admission.pod_metrics``, the same rounds' client), under the
  name Prometheus stores (a counter as ``<family>_total``);
* the dashboard is a Grafana dashboard (panels with queries, unique ids, the provisioned
  datasource) and the compose file provisions it, Prometheus (scraping the census server and
  every demo pod's metrics port) and the rules;
* ``promtool check rules`` and ``promtool check config`` pass (Debian's ``prometheus`` package,
  installed by .ci/run; skipped only outside CI when promtool is missing), and ``promtool test
  rules`` shows the outbox alerts fire on a growing outbox and not on a flat or draining one;
* deploy/k8s/monitoring/prometheus-rule.yaml embeds the rules file's groups as they are, and
  docs/operators.md documents every alert.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import redis
import yaml

pytest.importorskip("prometheus_client", reason="the serve extra: pip install 'admission[serve]'")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from admission import Admission  # noqa: E402
from helpers import POOL, policy  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DASHBOARDS = sorted((ROOT / "deploy" / "grafana").glob("*.json"))
PROVISIONING = ROOT / "deploy" / "grafana" / "provisioning"
PROM_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
RULES = ROOT / "deploy" / "prometheus" / "admission-rules.yml"
K8S_RULE = ROOT / "deploy" / "k8s" / "monitoring" / "prometheus-rule.yaml"
COMPOSE = ROOT / "docker-compose.yml"
OPERATORS = ROOT / "docs" / "operators.md"
MESH = "dash"

METRIC = re.compile(r"\badmission_[a-z0-9_]+")
QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')


def metric_names(expr: str) -> set[str]:
    """The admission metric names a PromQL expression uses (not words inside label matchers'
    strings: those are values, not metrics)."""
    return set(METRIC.findall(QUOTED.sub('""', expr)))


def dashboard(path: Path) -> dict:
    return json.loads(path.read_text())


def all_panels(dash: dict) -> list[dict]:
    """Every panel, those nested in collapsed rows included."""
    out = []
    for p in dash["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def dashboard_queries(dash: dict) -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and every templating query."""
    out = [(f"panel {p['id']} {p.get('title')!r}", t["expr"])
           for p in all_panels(dash) for t in p.get("targets", [])]
    for var in dash.get("templating", {}).get("list", []):
        q = var.get("query")
        out.append((f"variable {var['name']}", q.get("query", "") if isinstance(q, dict) else str(q or "")))
    return out


def rules() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def stored_names(text: str) -> tuple[set[str], set[str]]:
    """(every series name Prometheus would store from this exposition, those with a sample)."""
    suffixes = {"counter": ("_total",), "gauge": ("",), "untyped": ("",), "histogram": ("_bucket", "_sum", "_count"),
                "summary": ("", "_sum", "_count")}
    declared, sampled = set(), set()
    for fam in text_string_to_metric_families(text):
        declared.update(fam.name + s for s in suffixes.get(fam.type, ("",)))
        sampled.update(s.name for s in fam.samples)
    return declared, sampled


@pytest.fixture
def live_metrics(server_url, tmp_path) -> dict[str, str]:
    """The two /metrics Prometheus scrapes: ``census``, of `admission serve` (the CLI, its own
    process) over a mesh with a policy, a budget, rounds admitted, released, refused and
    rate-limited; ``pod``, the pod gauges of the client that ran those rounds (it has an outbox
    and holds seats), served by ``start_metrics_server``."""
    from admission.pod_metrics import start_metrics_server

    client = redis.Redis.from_url(server_url)
    pol = policy()
    pol["providers"]["p"]["daily_limit_usd"] = 50
    a = Admission(client, mesh=MESH, pod="pod-a", background=False, seed=1, outbox=tmp_path / "pod-a.outbox")
    a.ops.apply_policy(pol, recovery_hold=False)
    seats = [a.try_admit(lane="a", model=POOL, round_id=f"r-a-{i}").seat for i in range(3)]
    a.report(seats[1], signal="rate_limited")
    a.release(seats[0], outcome="clean", seconds=2.0, cost_usd=1.25)
    a.release(seats[1], outcome="rate_limited", seconds=1.0)
    for i in range(12):  # past the pool's slots: some are refused
        a.try_admit(lane="b", model=POOL, round_id=f"r-b-{i}")
    pod = start_metrics_server(a, 0, addr="127.0.0.1")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "admission", "serve", "--url", server_url, "--mesh", MESH,
                             "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        line = proc.stdout.readline()
        assert line.startswith(f"admission serve: http://127.0.0.1:{port}/"), (line, proc.stderr.read())
        deadline = time.monotonic() + 10
        while get(f"http://127.0.0.1:{port}/readyz")[0] != 200:
            assert time.monotonic() < deadline, "the census server never became ready"
            time.sleep(0.1)
        status, text = get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200
        pod_status, pod_text = get(pod.url)
        assert pod_status == 200
        yield {"census": text, "pod": pod_text}
    finally:
        pod.stop()
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        a.close()
        client.close()


# -- the metric names, against a live /metrics ----------------------------------------------------


def exported(live_metrics: dict[str, str]) -> tuple[set[str], set[str]]:
    """(declared, sampled) over everything Prometheus scrapes: the census server and a pod."""
    census, pod = stored_names(live_metrics["census"]), stored_names(live_metrics["pod"])
    return census[0] | pod[0], census[1] | pod[1]


def test_every_query_and_alert_uses_exported_metrics(live_metrics):
    declared, sampled = exported(live_metrics)
    # the rounds run above filled the series the main panels draw
    assert {"admission_census_up", "admission_pool_estimate", "admission_pool_running",
            "admission_budget_limit_usd", "admission_admitted_total", "admission_signals_total"} <= sampled
    # and the pod's own gauges, which the outbox alerts read
    assert {"admission_pod_pending_records", "admission_pod_outbox_bytes", "admission_pod_outbox_max_bytes",
            "admission_pod_rounds_held", "admission_pod_rounds_waiting"} <= sampled
    used: dict[str, set[str]] = {}
    for path in DASHBOARDS:
        for where, expr in dashboard_queries(dashboard(path)):
            for name in metric_names(expr):
                used.setdefault(name, set()).add(f"{path.name}: {where}")
    for rule in rules():
        for name in metric_names(rule["expr"]):
            used.setdefault(name, set()).add(f"{RULES.name}: {rule['alert']}")
    assert len(used) >= 15, sorted(used)
    assert any(name.startswith("admission_pod_") for name in used), "no alert reads a pod's gauges"
    missing = {name: sorted(where) for name, where in used.items() if name not in declared}
    assert not missing, f"not exported by admission serve or a pod: {missing}"


def test_the_name_check_is_not_a_rubber_stamp(live_metrics):
    declared, _ = exported(live_metrics)
    assert metric_names('sum(rate(admission_refused_total{reason="admission_nope"}[5m]))') == {"admission_refused_total"}
    assert "admission_refused_total" in declared
    assert "admission_refused" not in declared       # a counter is stored as <family>_total
    assert "admission_pool_estimate_total" not in declared
    assert "admission_pod_pending_records_total" not in declared   # a gauge keeps its name
    assert "admission_pod_outbox" not in declared
    # each source counts: the pod's gauges come from the pod, not from the census server
    census, _ = stored_names(live_metrics["census"])
    pod, _ = stored_names(live_metrics["pod"])
    assert "admission_pod_pending_records" in pod and "admission_pod_pending_records" not in census
    assert "admission_census_up" in census and "admission_census_up" not in pod
    # and the pod page is this pod's: the client that ran the rounds holds one seat (r-a-2)
    values = {(s.name, s.labels.get("pod")): s.value
              for fam in text_string_to_metric_families(live_metrics["pod"]) for s in fam.samples}
    assert values[("admission_pod_rounds_held", "pod-a")] >= 1


# -- the dashboard and its provisioning ------------------------------------------------------------


def test_dashboard_is_a_grafana_dashboard():
    assert [p.name for p in DASHBOARDS] == ["admission.json"]
    datasources = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yaml").read_text())["datasources"]
    uids = {d["uid"] for d in datasources if d["type"] == "prometheus"}
    for path in DASHBOARDS:
        dash = dashboard(path)
        assert dash["uid"] and dash["title"] and isinstance(dash["schemaVersion"], int)
        panels = all_panels(dash)
        ids = [p["id"] for p in panels]
        assert len(ids) == len(set(ids)), f"{path.name}: duplicate panel ids"
        queries = [p for p in panels if p["type"] != "row"]
        assert len(queries) >= 10
        for p in queries:
            assert p["title"] and p["targets"], p.get("title")
            assert p["datasource"]["uid"] in uids, p["title"]
            refs = [t["refId"] for t in p["targets"]]
            assert len(refs) == len(set(refs)) and all(t["expr"].strip() for t in p["targets"]), p["title"]
            grid = p["gridPos"]
            assert grid["x"] + grid["w"] <= 24 and grid["h"] > 0, p["title"]
        titles = " | ".join(p["title"] for p in queries)
        for shown in ("K-hat", "slots", "Refusals", "429", "closures", "starving", "Spend today", "Census age"):
            assert shown.lower() in titles.lower(), shown


def test_compose_provisions_prometheus_and_grafana():
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    for name in ("prometheus", "grafana"):
        for volume in services[name]["volumes"]:
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), (name, volume)
    mounts = {v.split(":")[1]: v.split(":")[0] for v in services["prometheus"]["volumes"]}
    config = yaml.safe_load(PROM_CONFIG.read_text())
    assert mounts["/etc/prometheus/prometheus.yml"] == "./deploy/prometheus/prometheus.yml"
    for rule_file in config["rule_files"]:    # relative to the config file, in both places
        assert (PROM_CONFIG.parent / rule_file).resolve() == RULES
        assert mounts[f"/etc/prometheus/{rule_file}"] == "./" + str(RULES.relative_to(ROOT))
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"admission", "admission-pods"}
    census_port = services["census-server"]["command"][services["census-server"]["command"].index("--port") + 1]
    assert jobs["admission"]["static_configs"][0]["targets"] == [f"census-server:{census_port}"]
    # every demo pod serves its gauges on the compose network, and Prometheus scrapes each one
    pods = {name: s for name, s in services.items() if s.get("command", [""])[0] == "demo-pod"}
    targets = []
    for name, s in pods.items():
        port = s["command"][s["command"].index("--metrics-port") + 1]
        assert port in s["expose"], name
        targets.append(f"{name}:{port}")
    assert len(pods) >= 2 and jobs["admission-pods"]["static_configs"][0]["targets"] == targets
    datasource = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yaml").read_text())["datasources"][0]
    assert datasource["url"] == "http://prometheus:9090" and "9090:9090" in services["prometheus"]["ports"]
    provider = yaml.safe_load((PROVISIONING / "dashboards" / "admission.yaml").read_text())["providers"][0]
    grafana = {v.split(":")[1]: v.split(":")[0] for v in services["grafana"]["volumes"]}
    assert grafana[provider["options"]["path"]] == "./deploy/grafana"
    assert grafana["/etc/grafana/provisioning"] == "./deploy/grafana/provisioning"


# -- the rules -----------------------------------------------------------------------------------


def promtool() -> str:
    found = shutil.which("promtool")
    if found:
        return found
    if os.environ.get("CI"):
        pytest.fail("promtool is not on PATH in CI (.ci/run installs Debian's prometheus package)")
    pytest.skip("promtool is not on PATH (apt-get install prometheus); CI runs this check")


def test_promtool_checks_the_rules():
    out = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(rules())} rules found" in out.stdout + out.stderr


def test_promtool_checks_the_config():
    out = subprocess.run([promtool(), "check", "config", str(PROM_CONFIG)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_promtool_is_not_a_rubber_stamp(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text("groups:\n  - name: x\n    rules:\n      - alert: X\n        expr: sum(admission_census_up\n")
    out = subprocess.run([promtool(), "check", "rules", str(bad)], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0


#: ``promtool test rules`` input: 15 s scrapes of pods whose pending records grow, stay flat, or
#: come and go (blips that replay within a minute); an outbox filling up; a census that goes down.
ALERT_CASES = """
evaluation_interval: 15s
tests:
  - interval: 15s
    input_series:
      - series: 'admission_pod_pending_records{mesh="m",pod="growing"}'
        values: '0 0 1+1x120'
      - series: 'admission_pod_pending_records{mesh="m",pod="flat"}'
        values: '3x120'
      - series: 'admission_pod_pending_records{mesh="m",pod="blips"}'
        values: '%(blips)s'
      - series: 'admission_pod_pending_records{mesh="m",pod="drained"}'
        values: '0 1+1x24 0x95'
      - series: 'admission_pod_outbox_bytes{mesh="m",pod="growing"}'
        values: '16+1000000x120'
      - series: 'admission_pod_outbox_max_bytes{mesh="m",pod="growing"}'
        values: '67108864x120'
      - series: 'admission_pod_outbox_bytes{mesh="m",pod="none"}'
        values: '0x120'
      - series: 'admission_pod_outbox_max_bytes{mesh="m",pod="none"}'
        values: '0x120'
      - series: 'admission_census_up{mesh="m"}'
        values: '1 1 0x120'
    alert_rule_test:
      - {eval_time: 9m, alertname: AdmissionOutboxGrowing, exp_alerts: []}
      - eval_time: 12m
        alertname: AdmissionOutboxGrowing
        exp_alerts: [{exp_labels: {severity: critical, mesh: m, pod: growing}}]
      - eval_time: 25m
        alertname: AdmissionOutboxGrowing
        exp_alerts: [{exp_labels: {severity: critical, mesh: m, pod: growing}}]
      - {eval_time: 10m, alertname: AdmissionOutboxNearlyFull, exp_alerts: []}
      - eval_time: 20m
        alertname: AdmissionOutboxNearlyFull
        exp_alerts: [{exp_labels: {severity: warning, mesh: m, pod: growing}}]
      - {eval_time: 1m, alertname: AdmissionRedisUnreachable, exp_alerts: []}
      - eval_time: 3m
        alertname: AdmissionRedisUnreachable
        exp_alerts: [{exp_labels: {severity: critical, mesh: m}}]
""" % {"blips": " ".join(["0 1 2 3 0"] * 25)}


def test_promtool_the_outbox_alerts_fire_on_a_growing_outbox_only(tmp_path):
    """A pod whose records grow without draining fires AdmissionOutboxGrowing after 10 minutes
    (5 without reaching 0, then `for: 5m`); a flat backlog, blips that replay, and a backlog that
    drained do not. (The rules are copied without their annotations: promtool would compare them.)"""
    doc = yaml.safe_load(RULES.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(doc))
    (tmp_path / "cases.yml").write_text("rule_files: [rules.yml]\n" + ALERT_CASES)
    out = subprocess.run([promtool(), "test", "rules", "cases.yml"], capture_output=True, text=True, timeout=60,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    # and the check bites: the flat pod is expected to fire, it does not
    (tmp_path / "cases.yml").write_text("rule_files: [rules.yml]\n" + ALERT_CASES.replace(
        "exp_labels: {severity: critical, mesh: m, pod: growing}}]\n      - eval_time: 25m",
        "exp_labels: {severity: critical, mesh: m, pod: flat}}]\n      - eval_time: 25m"))
    out = subprocess.run([promtool(), "test", "rules", "cases.yml"], capture_output=True, text=True, timeout=60,
                         cwd=tmp_path)
    assert out.returncode != 0


def test_alerts_cover_what_operators_watch():
    found = rules()
    names = [r["alert"] for r in found]
    assert len(names) == len(set(names))
    for r in found:
        assert r["labels"]["severity"] in ("critical", "warning", "info"), r["alert"]
        assert r["annotations"]["summary"] and r["annotations"]["description"], r["alert"]
        assert re.fullmatch(r"\d+[smh]", r["for"]), r["alert"]
    uses = {r["alert"]: metric_names(r["expr"]) for r in found}
    watched = {  # the list: provider closed, lane starving, K-hat collapsing, 429s, census stale, outbox
        "AdmissionProviderClosed": "admission_pool_closed", "AdmissionLaneStarving": "admission_starving",
        "AdmissionEstimateCollapsing": "admission_pool_estimate", "AdmissionRateLimitedRising": "admission_signals_total",
        "AdmissionCensusStale": "admission_census_age_seconds", "AdmissionRedisUnreachable": "admission_census_up",
        "AdmissionOutboxGrowing": "admission_pod_pending_records"}
    for alert, metric in watched.items():
        assert metric in uses[alert], alert
    assert 'signal="rate_limited"' in next(r["expr"] for r in found if r["alert"] == "AdmissionRateLimitedRising")


def test_k8s_prometheus_rule_embeds_the_rules_file():
    doc = yaml.safe_load(K8S_RULE.read_text())
    assert (doc["apiVersion"], doc["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    hint = ("regenerate: python -c \"import yaml; print(yaml.safe_dump({'groups': "
            "yaml.safe_load(open('deploy/prometheus/admission-rules.yml'))['groups']}))\"")
    assert doc["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"], hint


def test_operators_guide_documents_every_alert():
    text = OPERATORS.read_text()
    section = text[text.index("## Alerts"):]
    for r in rules():
        assert f"`{r['alert']}`" in section, r["alert"]
    assert "deploy/grafana/admission.json" in text and "deploy/prometheus/admission-rules.yml" in text
