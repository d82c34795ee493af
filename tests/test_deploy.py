"""The deploy files: they validate offline, they are wired to each other, and the Redis ACL users
of deploy/redis-acl.conf do what docs/production.md says, on real servers.

* every document of every YAML under deploy/k8s validates with kubernetes-validate (strict: an
  unknown field is an error) against two bundled Kubernetes versions;
* docker-compose.yml validates against the Compose schema (check-jsonschema's vendored copy, so
  offline), and keeps Redis on AOF everysec, the census server, the roll-over and demo pods;
* the manifests refer only to Secrets, ConfigMaps and keys that deploy/k8s defines, every
  `$(VAR)` is defined in its container, and the admission containers' arguments parse with the
  CLI's own parser; the worker takes its pod id from the Downward API;
* the worker's metrics port is the one its `--metrics-port` names, and
  deploy/k8s/monitoring/pod-monitor.yaml (a PodMonitor: a CRD, checked field by field here)
  scrapes it on the worker pods;
* the ACL lines, applied to a real Redis 7 / Valkey 8: the pod user runs the rules (admit, wait
  and be woken, heartbeat, tick, census, charge, release, the roll-over) with nothing refused,
  and may not FLUSHALL, touch keys or channels outside adm:*, run EVAL or FUNCTION LOAD; the
  admin user loads the library and applies the policy, which a pod of a new version needs.
"""
from __future__ import annotations

import contextlib
import io
import logging
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import kubernetes_validate
import pytest
import redis
import structlog
import yaml
from redis.exceptions import NoPermissionError

from admission import Admission, cli, scripts
from admission.errors import ScriptError
from admission.policy import load as load_policy

from acl import ACL_FILE, ADMIN_PW, POD_PW, acl_lines, apply_acl, drop_users, user_url
from figures import record
from helpers import policy

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "k8s"
COMPOSE = ROOT / "docker-compose.yml"
EXAMPLE_POLICY = ROOT / "deploy" / "policy.example.toml"
MANIFESTS = sorted(K8S.glob("*.yaml")) + sorted(K8S.glob("*.yml"))
#: CronJob.spec.timeZone is GA from 1.27; 1.30 is a version clusters still run, and the newest
#: schema the package bundles catches fields removed since.
K8S_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
MESH = "deploy"


def docs(path: Path) -> list[dict]:
    found = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert found, f"{path.name}: no document"
    return found


def all_docs() -> list[tuple[str, dict]]:
    return [(p.name, d) for p in MANIFESTS for d in docs(p)]


def pod_specs() -> list[tuple[str, dict]]:
    """(file, pod spec) of every workload."""
    out = []
    for name, d in all_docs():
        spec = d.get("spec", {})
        if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            out.append((name, spec["template"]["spec"]))
        elif d["kind"] == "CronJob":
            out.append((name, spec["jobTemplate"]["spec"]["template"]["spec"]))
    return out


def containers(spec: dict) -> list[dict]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def by_kind(kind: str, name: str) -> dict:
    return next(d for _, d in all_docs() if d["kind"] == kind and d["metadata"]["name"] == name)


# --------------------------------------------------------------------------
# Kubernetes manifests, offline


def test_the_manifests_are_there():
    names = {p.name for p in MANIFESTS}
    assert {"worker-deployment.yaml", "census-server.yaml", "cronjob-day-rollover.yaml",
            "policy-configmap.yaml", "policy-apply-job.yaml", "secret-redis.example.yaml"} <= names
    assert not (ROOT / "deploy" / "cronjob-day-rollover.yaml").exists()   # moved into k8s/


@pytest.mark.parametrize("path", MANIFESTS, ids=[p.name for p in MANIFESTS])
def test_k8s_manifest_validates_offline(path):
    for doc in docs(path):
        for version in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{path.name} {doc.get('kind')}/{doc.get('metadata', {}).get('name')} "
                            f"against {version}: {exc.message} at {'.'.join(map(str, exc.path))}")


def test_strict_validation_catches_a_misspelt_field():
    """The validator is not a rubber stamp: a probe under a misspelt name is refused."""
    doc = docs(K8S / "census-server.yaml")[0]
    container = doc["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, K8S_VERSIONS[0], strict=True)


def test_worker_pod_id_comes_from_the_downward_api():
    spec = by_kind("Deployment", "agent-worker")["spec"]["template"]["spec"]
    worker = next(c for c in spec["containers"] if c["name"] == "worker")
    env = {e["name"]: e for e in worker["env"]}
    assert env["ADMISSION_POD"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["ADMISSION_URL"]["valueFrom"]["secretKeyRef"] == {"name": "admission-redis", "key": "url"}
    assert env["ADMISSION_MESH"]["valueFrom"]["configMapKeyRef"]["key"] == "mesh"
    outbox = env["ADMISSION_OUTBOX_DIR"]["value"]
    assert any(m["mountPath"] == outbox for m in worker["volumeMounts"])


def test_census_server_probes_port_and_scrape_annotations():
    deploy = by_kind("Deployment", "admission-census")
    tmpl = deploy["spec"]["template"]
    (serve,) = tmpl["spec"]["containers"]
    assert serve["args"][0] == "serve" and serve["args"][serve["args"].index("--port") + 1] == "9464"
    assert serve["ports"] == [{"name": "http", "containerPort": 9464, "protocol": "TCP"}]
    assert serve["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert serve["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    scrape = {"prometheus.io/scrape": "true", "prometheus.io/port": "9464", "prometheus.io/path": "/metrics"}
    assert tmpl["metadata"]["annotations"] == scrape
    svc = by_kind("Service", "admission-census")
    assert svc["spec"]["selector"].items() <= tmpl["metadata"]["labels"].items()
    assert svc["spec"]["ports"][0]["port"] == 9464 and svc["metadata"]["annotations"] == scrape


#: The fields of a PodMonitor (monitoring.coreos.com/v1) this project's file may use: the CRD is
#: not bundled with kubernetes-validate, so a misspelt field is caught here instead.
POD_MONITOR_SPEC = {"selector", "namespaceSelector", "podMetricsEndpoints", "jobLabel", "podTargetLabels",
                    "sampleLimit", "targetLimit"}
POD_MONITOR_ENDPOINT = {"port", "portNumber", "path", "scheme", "interval", "scrapeTimeout", "honorLabels",
                        "honorTimestamps", "relabelings", "metricRelabelings", "params", "enableHttp2"}


def test_worker_metrics_port_and_its_pod_monitor():
    """The worker serves its pod gauges on a named port (the example workers' --metrics-port),
    annotated for annotation-based scrapes; deploy/k8s/monitoring/pod-monitor.yaml (the Operator's
    PodMonitor, a CRD) selects those pods and scrapes that port, their own labels kept."""
    tmpl = by_kind("Deployment", "agent-worker")["spec"]["template"]
    worker = next(c for c in tmpl["spec"]["containers"] if c["name"] == "worker")
    (port,) = [p for p in worker["ports"] if p["name"] == "metrics"]
    assert worker["args"][worker["args"].index("--metrics-port") + 1] == str(port["containerPort"])
    assert tmpl["metadata"]["annotations"] == {"prometheus.io/scrape": "true", "prometheus.io/path": "/metrics",
                                               "prometheus.io/port": str(port["containerPort"])}
    pytest.importorskip("openai")  # the examples' own dependency
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import worker_async
        import worker_sync
    finally:
        sys.path.pop(0)
    for example in (worker_sync, worker_async):  # the flag parses with the examples' own parsers
        assert example.arguments(worker["args"]).metrics_port == port["containerPort"]
    (monitor,) = docs(K8S / "monitoring" / "pod-monitor.yaml")
    assert (monitor["apiVersion"], monitor["kind"]) == ("monitoring.coreos.com/v1", "PodMonitor")
    assert set(monitor["metadata"]) <= {"name", "namespace", "labels", "annotations"}
    spec = monitor["spec"]
    assert set(spec) <= POD_MONITOR_SPEC, set(spec) - POD_MONITOR_SPEC
    assert spec["selector"]["matchLabels"].items() <= tmpl["metadata"]["labels"].items()
    (endpoint,) = spec["podMetricsEndpoints"]
    assert set(endpoint) <= POD_MONITOR_ENDPOINT, set(endpoint) - POD_MONITOR_ENDPOINT
    assert endpoint["port"] == port["name"] and endpoint["path"] == "/metrics"
    assert endpoint["honorLabels"] is True  # the pod's own `pod` label, not the Operator's
    assert re.fullmatch(r"\d+[sm]", endpoint["interval"])


def test_midnight_cronjob_and_the_policy_job():
    cron = by_kind("CronJob", "admission-day-rollover")["spec"]
    assert (cron["schedule"], cron["timeZone"], cron["concurrencyPolicy"]) == ("0 0 * * *", "Etc/UTC", "Forbid")
    job = by_kind("Job", "admission-policy-apply")["spec"]["template"]["spec"]
    (apply,) = job["containers"]
    assert apply["args"][:3] == ["config", "apply", "/etc/admission/policy.toml"]
    env = {e["name"]: e for e in apply["env"]}
    assert env["ADMISSION_ADMIN_URL"]["valueFrom"]["secretKeyRef"]["key"] == "admin-url"  # it loads the library
    mount = next(m for m in apply["volumeMounts"] if m["mountPath"] == "/etc/admission")
    volume = next(v for v in job["volumes"] if v["name"] == mount["name"])
    assert volume["configMap"]["name"] == "admission-policy"


def test_policy_configmap_is_the_example_policy_and_validates():
    data = by_kind("ConfigMap", "admission-policy")["data"]
    assert data["policy.toml"] == EXAMPLE_POLICY.read_text(), "policy-configmap.yaml drifted from the example"
    assert load_policy(EXAMPLE_POLICY)["lanes"]
    assert re.fullmatch(r"[A-Za-z0-9._-]{1,64}", data["mesh"])


def test_secret_is_an_example_without_a_password():
    secret = by_kind("Secret", "admission-redis")["stringData"]
    assert secret["url"].startswith("redis://admission:CHANGE-ME")
    assert secret["admin-url"].startswith("redis://admission-admin:CHANGE-ME")
    for line in ACL_FILE.read_text().splitlines():   # the ACL file holds placeholders only
        if line.startswith("ACL ") and " on " in line:
            assert re.search(r" >\$\{ADMISSION_(POD|ADMIN)_PASSWORD\} ", line), line


def test_references_resolve_and_variables_are_defined():
    """Every Secret, ConfigMap and key a container names is defined in deploy/k8s (or optional),
    and every $(VAR) in a command is in that container's env."""
    defined = {(d["kind"], d["metadata"]["name"]): set((d.get("data") or {}) | (d.get("stringData") or {}))
               for _, d in all_docs() if d["kind"] in ("Secret", "ConfigMap")}
    for name, spec in pod_specs():
        for c in containers(spec):
            env = {e["name"] for e in c.get("env", [])}
            for e in c.get("env", []):
                ref = e.get("valueFrom", {})
                for kind, field in (("Secret", "secretKeyRef"), ("ConfigMap", "configMapKeyRef")):
                    if field in ref and not ref[field].get("optional"):
                        assert ref[field]["key"] in defined.get((kind, ref[field]["name"]), set()), (name, e)
            for word in [*c.get("command", []), *c.get("args", [])]:
                for var in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", word):
                    assert var in env, f"{name} {c['name']}: $({var}) is not in its env"
        for v in spec.get("volumes", []):
            if "configMap" in v:
                keys = defined.get(("ConfigMap", v["configMap"]["name"]), set())
                assert {i["key"] for i in v["configMap"].get("items", [])} <= keys, (name, v)


def test_admission_containers_arguments_parse():
    """The arguments of every container running the `admission` command parse with the CLI's
    parser (`serve`, written separately, is checked for its documented flags until it lands)."""
    parser = cli.build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    seen = set()
    for name, spec in pod_specs():
        for c in containers(spec):
            if c["image"].startswith("admission:"):
                argv = c["args"]
            elif c.get("command", [])[:3] == ["python", "-m", "admission"]:
                argv = c["command"][3:]
            else:
                continue
            seen.add(argv[0])
            if argv[0] in commands:
                args = parser.parse_args(argv)
                mesh = args.mesh if isinstance(args.mesh, str) else " ".join(args.mesh)   # serve: a list
                assert args.url.startswith("$(") and mesh == "$(ADMISSION_MESH)", (name, argv)
            else:
                assert argv[0] == "serve", (name, argv)
                flags = set(argv[1::2])
                assert flags == {"--url", "--mesh", "--host", "--port"}, (name, argv)
    assert seen == {"serve", "day-rollover", "config", "tick"}


# --------------------------------------------------------------------------
# docker-compose.yml, offline


def _check_jsonschema() -> str:
    exe = Path(sys.executable).with_name("check-jsonschema")
    if not exe.exists():
        pytest.skip("check-jsonschema is not installed in this virtualenv (pip install -e '.[test]')")
    return str(exe)


def test_compose_validates_against_the_compose_schema(tmp_path):
    exe = _check_jsonschema()
    out = subprocess.run([exe, "--builtin-schema", "vendor.compose-spec", str(COMPOSE)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    bad = tmp_path / "compose.yml"   # and it is not a rubber stamp
    bad.write_text(COMPOSE.read_text().replace("    healthcheck:\n      test:", "    healthcheck:\n      tset:", 1))
    out = subprocess.run([exe, "--builtin-schema", "vendor.compose-spec", str(bad)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "tset" in out.stdout + out.stderr


def test_compose_runs_redis_with_aof_and_the_services():
    doc = yaml.safe_load(COMPOSE.read_text())
    services = doc["services"]
    cmd = services["redis"]["command"]
    assert cmd[0] == "redis-server"
    assert cmd[cmd.index("--appendonly") + 1] == "yes" and cmd[cmd.index("--appendfsync") + 1] == "everysec"
    volume = services["redis"]["volumes"][0].split(":")
    assert volume[1] == "/data" and volume[0] in doc["volumes"]
    serve = services["census-server"]
    assert serve["command"][0] == "serve" and "9464:9464" in serve["ports"]
    assert "admission day-rollover" in services["day-rollover"]["command"][0]
    pods = [s for s in services.values() if s.get("command", [""])[0] == "demo-pod"]
    assert len(pods) >= 2 and len({p["command"][p["command"].index("--pod") + 1] for p in pods}) == len(pods)


# --------------------------------------------------------------------------
# The Redis ACL users, on real servers

LUA_CALL = re.compile(r"redis\.p?call\(\s*['\"]([A-Za-z]+)['\"]")


def grants(user: str) -> set[str]:
    """The +commands of a user's lines in the file."""
    return {w[1:].lower() for args in acl_lines() if args[2] == user for w in args[3:] if w.startswith("+")}


def test_acl_grants_every_command_the_functions_call_and_no_more_to_the_admin():
    lua_commands = set()
    for path in (ROOT / "lua").rglob("*.lua"):
        text = path.read_text()
        lua_commands |= {c.lower() for c in LUA_CALL.findall(text)}
        dynamic = re.findall(r"redis\.p?call\(\s*[^'\"\s]", text)
        assert not dynamic, f"{path.name}: a redis.call with a computed command; list it in the ACL by hand"
    pod, admin = grants("admission"), grants("admission-admin")
    assert lua_commands and lua_commands <= pod, f"missing in deploy/redis-acl.conf: {sorted(lua_commands - pod)}"
    assert {"fcall", "fcall_ro", "hmget", "hgetall", "get", "subscribe", "unsubscribe", "ping"} <= pod
    assert admin - pod == {"function|load", "function|list", "function|delete", "xrevrange", "xread"}
    assert pod <= admin
    never = {"flushall", "flushdb", "keys", "scan", "eval", "evalsha", "script", "config", "acl", "function",
             "function|flush", "function|restore", "debug", "shutdown", "monitor", "select", "@all", "client"}
    assert not (pod | admin) & never
    for args in acl_lines():
        if "reset" in args:
            assert {"~adm:*", "&adm:*", "-@all", "on"} <= set(args) and args[3] == "reset", args


def test_acl_pod_user_runs_the_rules_and_nothing_else(server_url, real_engine):
    root = redis.Redis.from_url(server_url)
    drop_users(root)
    apply_acl(root, acl_lines())
    root.execute_command("ACL", "LOG", "RESET")
    root.set("other:key", "not yours")
    pod_a = pod_b = admin = None
    try:
        admin = Admission.from_url(user_url(server_url, "admission-admin", ADMIN_PW), mesh=MESH, pod="ops",
                                   background=False)
        scripts.load(admin.redis)                               # the admin may load the library
        pol = policy(grow_interval=60, max_estimate=2)             # 2 slots, no growth
        pol["clock"] = "server"                                 # the background clock calls without now=
        admin.ops.apply_policy(pol, recovery_hold=False)

        pod_url = user_url(server_url, "admission", POD_PW)
        pod_a = Admission.from_url(pod_url, mesh=MESH, pod="pod-a", background=False)
        pod_b = Admission.from_url(pod_url, mesh=MESH, pod="pod-b")
        assert pod_a.policy()["version"] == 1 and pod_a.tunables()
        d1 = pod_a.try_admit(lane="a", model="m@p", round_id="r1", draw=0.0)
        d2 = pod_a.try_admit(lane="a", model="m@p", round_id="r2", draw=0.0)
        assert d1.admitted and d2.admitted and d2.slots == 2
        assert pod_a.heartbeat() is not None and pod_a.tick() is not None
        assert pod_a.charge(d1.seat, cost_usd=0.25, key="step-1").booked
        # a waiter of another pod, woken by the release's PUBLISH on adm:{deploy}:wake
        got: dict = {}
        waiter = threading.Thread(target=lambda: got.update(
            d=pod_b.admit_waiting(lane="a", model="m@p", round_id="r3", timeout=8)))
        waiter.start()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not (
                root.zcard(f"adm:{{{MESH}}}:tickets") and root.pubsub_numsub(f"adm:{{{MESH}}}:wake")[0][1]):
            time.sleep(0.02)
        assert root.zcard(f"adm:{{{MESH}}}:tickets") == 1, "the round never waited"
        released_at = time.monotonic()
        assert pod_a.release(d1.seat, outcome="clean", seconds=1.0, cost_usd=0.5).status.name == "RELEASED"
        waiter.join(10)
        assert got["d"].admitted and got["d"].seat.pod == "pod-b"
        assert time.monotonic() - released_at < 3, "woken by the clock, not by the wake channel"
        assert pod_a.report(d2.seat, signal="stall").status.name == "REPORTED"
        pod_b.release(got["d"].seat, outcome="clean", seconds=0.5)
        pod_a.release(d2.seat, outcome="stall", seconds=2.0)
        census = pod_a.ops.census()
        assert census["mesh"] == MESH and census["pools"][0]["running"] == 0
        assert pod_a.plan(lane="a", model="m@p", wanted=3) >= 1 and pod_a.allowance(lane="a") >= 1
        day = time.strftime("%Y-%m-%d", time.gmtime())
        assert pod_a.ops.ledger(day)["a"]["p"] == pytest.approx(0.75)
        assert pod_a.ops.rollover().day                                          # the midnight CronJob's call
        assert pod_a.redis.get(f"adm:{{{MESH}}}:census")                     # GET of the read model
        # the CLI: the services' commands as the pod user, the operator's as the admin
        admin_url = user_url(server_url, "admission-admin", ADMIN_PW)
        for url, argv in ((pod_url, ["census"]), (pod_url, ["census", "--json"]), (pod_url, ["ledger"]),
                          (pod_url, ["day-rollover"]), (pod_url, ["config", "show"]), (pod_url, ["doctor"]),
                          (admin_url, ["events", "--count", "5"]), (admin_url, ["doctor"])):
            rc, out = run_cli(*argv, "--url", url, "--mesh", MESH)
            assert rc == 0, (argv, out)
        log = root.execute_command("ACL", "LOG")
        assert not log, f"the rules met a refusal: {log}"
        record("security", "ACL pod user: refusals met by the rules, the wait, the CLI", len(log), must="0",
               settings={"user": "admission (deploy/redis-acl.conf)", "engine": real_engine})

        # ... and nothing else
        p = pod_a.redis
        refused = [lambda: p.flushall(), lambda: p.flushdb(), lambda: p.get("other:key"),
                   lambda: p.set("other:key", "x"), lambda: p.delete("other:key"), lambda: p.keys("*"),
                   lambda: p.scan(0), lambda: p.eval("return 1", 0), lambda: p.config_get("maxmemory"),
                   lambda: p.execute_command("ACL", "LIST"), lambda: p.select(1),
                   lambda: scripts.load(p), lambda: p.function_delete(f"admission_{scripts.library()[1]}"),
                   lambda: p.function_flush(), lambda: p.function_list(),
                   # a function of the library called on keys outside adm:* is refused at the door
                   lambda: p.execute_command("FCALL", scripts.function_name("census"), 1, "other:config")]
        for i, call in enumerate(refused):
            with pytest.raises(NoPermissionError):
                call()
                pytest.fail(f"refused[{i}] was allowed")
        record("security", "ACL pod user: commands outside its grant refused", f"{len(refused)} of {len(refused)}",
               must="all", settings={"user": "admission (deploy/redis-acl.conf)", "engine": real_engine})
        sub = pod_a.redis.pubsub()
        sub.subscribe("other:wake")
        with pytest.raises(NoPermissionError):
            sub.get_message(timeout=2)
        sub.close()
        assert root.get("other:key") == b"not yours"
        # the admin: the library yes, the rest of the server no
        a = admin.redis
        assert f"admission_{scripts.library()[1]}" in repr(a.function_list())
        assert a.xrevrange(f"adm:{{{MESH}}}:events", count=1)
        for call in (lambda: a.flushall(), lambda: a.get("other:key"), lambda: a.function_flush(),
                     lambda: a.config_get("maxmemory"), lambda: a.keys("*"), lambda: a.eval("return 1", 0)):
            with pytest.raises(NoPermissionError):
                call()
    finally:
        for c in (pod_a, pod_b, admin):
            if c is not None:
                c.close()
        drop_users(root)
        root.delete("other:key")
        root.close()


def run_cli(*argv: str) -> tuple[int, str]:
    """`admission ...` in this process (a subprocess costs a second), its logging set back after."""
    logger = logging.getLogger("admission")
    saved = structlog.get_config(), logger.level, list(logger.handlers), logger.propagate
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            rc = cli.main(list(argv))
    finally:
        structlog.configure(**saved[0])
        logger.setLevel(saved[1])
        logger.handlers[:] = saved[2]
        logger.propagate = saved[3]
    return rc, out.getvalue()


def _cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "admission", *argv], capture_output=True, text=True, timeout=60)


def test_acl_a_new_library_is_loaded_by_the_admin_job_not_by_pods(server_url):
    """After an upgrade (a library version the server lacks) a pod is refused FUNCTION LOAD, so
    the worker's init container (`admission tick` as the pod user) fails (as with no policy) until the policy Job
    (`admission config apply` as admission-admin) has loaded it; then the pod works."""
    root = redis.Redis.from_url(server_url)
    drop_users(root)
    apply_acl(root, acl_lines())
    version = scripts.library()[1]
    pod_url = user_url(server_url, "admission", POD_PW)
    pod = None
    try:
        try:
            root.function_delete(f"admission_{version}")       # a server that never saw this version
        except redis.ResponseError:
            pass                                                # not loaded yet: the same
        gate = _cli("tick", "--url", pod_url, "--mesh", MESH)
        # refused FUNCTION LOAD: the mesh has no rules yet, as with no policy (exit 4), and says so
        assert gate.returncode == 4 and "config apply" in gate.stderr, gate.stderr
        assert any(e.get("object") == "function|load" for e in root.acl_log())
        job = _cli("config", "apply", str(EXAMPLE_POLICY), "--url", user_url(server_url, "admission-admin", ADMIN_PW),
                   "--mesh", MESH, "--no-recovery-hold")
        assert job.returncode == 0 and "version 1" in job.stdout, job.stderr
        gate = _cli("tick", "--url", pod_url, "--mesh", MESH)
        assert gate.returncode == 0, gate.stderr
        pod = Admission.from_url(pod_url, mesh=MESH, pod="pod-new", background=False)
        d = pod.try_admit(lane="reviews", model="sonnet@anthropic", round_id="t1")
        assert d.admitted
        pod.release(d.seat, outcome="clean", seconds=0.1)
    finally:
        if pod is not None:
            pod.close()
        drop_users(root)
        root.close()


def test_acl_narrowed_to_one_mesh(server_url):
    """docs/production.md: replacing adm:* by adm:{<mesh>}:* confines a user to its mesh."""
    root = redis.Redis.from_url(server_url)
    drop_users(root)
    apply_acl(root, acl_lines(mesh_pattern=f"adm:{{{MESH}}}:*"))
    clients = []
    try:
        for mesh in (MESH, "elsewhere"):
            Admission(root, mesh=mesh, pod="ops", background=False).ops.apply_policy(policy(), recovery_hold=False)
        pod = Admission.from_url(user_url(server_url, "admission", POD_PW), mesh=MESH, pod="p", background=False)
        other = Admission.from_url(user_url(server_url, "admission", POD_PW), mesh="elsewhere", pod="p",
                                   background=False)
        clients += [pod, other]
        d = pod.try_admit(lane="a", model="m@p", round_id="n1", now=2e9, draw=0.0)
        assert d.admitted
        pod.release(d.seat, outcome="clean", seconds=1.0, now=2e9 + 1)
        with pytest.raises((NoPermissionError, ScriptError)):
            other.try_admit(lane="a", model="m@p", round_id="n2", now=2e9, draw=0.0)
        with pytest.raises(NoPermissionError):
            other.redis.hmget("adm:{elsewhere}:config", "version")
    finally:
        for c in clients:
            c.close()
        drop_users(root)
        root.close()


def test_acl_on_a_cluster(cluster):
    """A Redis Cluster: ACLs are per node, so the lines go to every node; redis-py's cluster
    client then needs the slot map and the command table, which the file's cluster line grants."""
    from redis.cluster import RedisCluster

    nodes = [redis.Redis(port=port) for port in cluster.ports]
    mesh = f"deploy-{time.time_ns()}"                # the cluster is never flushed
    clients = []
    try:
        for n in nodes:
            drop_users(n)
            apply_acl(n, acl_lines())
        admin = RedisCluster(startup_nodes=cluster.startup_nodes, username="admission-admin", password=ADMIN_PW)
        pod = RedisCluster(startup_nodes=cluster.startup_nodes, username="admission", password=POD_PW)
        clients += [admin, pod]
        scripts.load(admin)                          # on every primary
        Admission(admin, mesh=mesh, pod="ops", background=False).ops.apply_policy(policy(), recovery_hold=False)
        adm = Admission(pod, mesh=mesh, pod="p", background=False)
        d = adm.try_admit(lane="a", model="m@p", round_id="c1", now=2e9, draw=0.0)
        assert d.admitted
        assert adm.release(d.seat, outcome="clean", seconds=1.0, now=2e9 + 1).status.name == "RELEASED"
        with pytest.raises(NoPermissionError):
            pod.execute_command("FUNCTION", "LOAD", "REPLACE", scripts.library()[0],
                                target_nodes=RedisCluster.PRIMARIES)
        with pytest.raises(NoPermissionError):
            pod.get(f"other:{mesh}")
    finally:
        for c in clients:
            c.close()
        for n in nodes:
            drop_users(n)
            n.close()


def test_a_ledger_record_that_meets_a_lost_library_waits_for_the_admin(server_url, tmp_path):
    """A wiped server lost the library too, and the pod user may not load it: the pod's charge is
    "no policy yet" (the record waits in the outbox), not a refusal that drops its cost. Once the
    admin's job has loaded the library and applied the policy again, the replay books it once."""
    root = redis.Redis.from_url(server_url)
    drop_users(root)
    apply_acl(root, acl_lines())
    admin = Admission.from_url(user_url(server_url, "admission-admin", ADMIN_PW), mesh=MESH, pod="ops",
                               background=False)
    pod = None
    try:
        admin.ops.apply_policy(policy(), recovery_hold=False)
        pod = Admission.from_url(user_url(server_url, "admission", POD_PW), mesh=MESH, pod="p", background=False,
                                 outbox=str(tmp_path / "p.outbox"))
        d = pod.try_admit(lane="a", model="m@p", round_id="w1", draw=0.0)
        assert d.admitted
        root.function_flush()  # the wipe: the library is gone with the data
        root.flushall()
        charged = pod.charge(d.seat, cost_usd=0.25, key="step")
        assert charged.queued and pod.flush() == 1
        admin.ops.apply_policy(policy(), recovery_hold=False)  # the admin's job loads the library again
        assert pod.flush() == 0
        assert pod.ops.ledger(time.strftime("%Y-%m-%d", time.gmtime()))["*"]["p"] == pytest.approx(0.25)
    finally:
        if pod is not None:
            pod.close()
        admin.close()
        drop_users(root)
        root.close()
