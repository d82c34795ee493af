"""One pod of the chaos fleet: a real process running rounds through `Admission.round()`.

    python tests/chaos/pod.py '<json settings>'

Settings (JSON): url | sentinels [[host, port], ...] + master | cluster_nodes [[host, port], ...],
mesh, pod, lanes, pools, threads, seed, journal (a file), outbox (a file, optional), provider (the
fake provider's base URL, optional), work_s [lo, hi] (each round's own work after the provider
call; long_s [lo, hi]: thread 0's instead, so a test can time a fault inside a long round),
round_timeout, clock_skew (seconds added to this process's wall clock: a pod whose clock is
off), username/password (the ACL pod user), confirm_replicas (WAIT for that many replicas after
each release and charge).

Each worker thread loops until SIGTERM: pick a lane and a pool (and for half the rounds a declared
size, `tokens`, reported halfway with `progress` and ended with what it `received`: the cap
line's bookkeeping meets every fault), `with adm.round(...)`, call the provider, book a mid-round
charge (key "step") and set the round's cost, and end. Every step is a JSON line in the journal,
written *before* the call it announces (a charge that may have been applied is always in the
journal) and after it returns:

    ask / admitted (seq, reason, running, slots, pool) / charge (usd) / cost (usd) / released /
    shed (the round never got a seat: the error) / failed (an exception inside the round) /
    reasserted (seat ids a heartbeat re-asserted) / queued (a ledger record that waits: Redis
    unreachable, or not confirmed by a replica) / exit (outbox records still pending)

Costs are whole micro-USD so the checker can add them exactly. On SIGTERM the pod finishes its
rounds, replays its outbox until it is empty (or 20 s), closes and exits 0.
"""
from __future__ import annotations

import http.client
import json
import logging
import os
import random
import signal
import sys
import threading
import time
from urllib.parse import urlparse

import redis


def _client(cfg: dict):
    from admission.client import fail_fast_options

    auth = {k: cfg[k] for k in ("username", "password") if cfg.get(k)}
    fast = fail_fast_options()
    if cfg.get("sentinels"):
        from redis.sentinel import Sentinel

        sentinel = Sentinel([tuple(a) for a in cfg["sentinels"]], sentinel_kwargs=fast, **fast)
        return sentinel.master_for(cfg.get("master", "admission"), **auth)
    if cfg.get("cluster_nodes"):
        from redis.cluster import ClusterNode, RedisCluster

        return RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in cfg["cluster_nodes"]], **auth, **fast)
    return redis.Redis.from_url(cfg["url"], **auth, **fast)


class Journal:
    def __init__(self, path: str, pod: str):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.pod = pod

    def __call__(self, ev: str, **fields) -> None:
        line = json.dumps({"t": REAL_TIME(), "pod": self.pod, "ev": ev, **fields}, default=str)
        os.write(self.fd, (line + "\n").encode())  # one write per line: whole lines, even on SIGKILL


REAL_TIME = time.time


class ProviderError(Exception):
    def __init__(self, status: int, retry_after: str | None):
        super().__init__(f"provider answered {status}")
        self.status_code = status
        self.headers = {"retry-after": retry_after} if retry_after else {}


def call_provider(conn_box: list, base: str, model: str) -> None:
    u = urlparse(base)
    if not conn_box:
        conn_box.append(http.client.HTTPConnection(u.hostname, u.port, timeout=30))
    body = json.dumps({"model": model, "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]})
    try:
        conn_box[0].request("POST", "/v1/chat/completions", body=body, headers={"content-type": "application/json",
                                                                            "authorization": "Bearer chaos"})
        resp = conn_box[0].getresponse()
        resp.read()
    except (OSError, http.client.HTTPException):
        conn_box.clear()
        raise
    if resp.status != 200:
        raise ProviderError(resp.status, resp.getheader("retry-after"))


def main() -> int:
    cfg = json.loads(sys.argv[1])
    if cfg.get("clock_skew"):
        skew = float(cfg["clock_skew"])
        time.time = lambda: REAL_TIME() + skew  # this process's wall clock is off by `skew`
    from admission import Admission
    from admission.errors import AdmissionError

    pod = cfg["pod"]
    journal = Journal(cfg["journal"], pod)
    adm = Admission(_client(cfg), mesh=cfg["mesh"], pod=pod, background=True, seed=cfg.get("seed", 1),
                    outbox=cfg.get("outbox"), confirm_replicas=cfg.get("confirm_replicas", 0))
    beat = adm.heartbeat

    def heartbeat(now=None):  # the journal learns which seats a heartbeat re-asserted
        hb = beat(now)
        if hb.reasserted:
            journal("reasserted", ids=list(hb.reasserted))
        return hb

    adm.heartbeat = heartbeat

    class Queued(logging.Handler):  # the journal learns which ledger writes waited, and why
        def emit(self, record: logging.LogRecord) -> None:
            fields = getattr(record, "admission", None) or {}
            if fields.get("event") == "ledger_record_queued":
                journal("queued", id=fields.get("round"), op=fields.get("op"), why=str(fields.get("why")))

    logging.getLogger("admission").addHandler(Queued())
    logging.getLogger("admission").setLevel(logging.INFO)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    lo, hi = cfg.get("work_s", [0.02, 0.08])

    def worker(n: int) -> None:
        rng = random.Random(cfg.get("seed", 1) * 1000 + n)
        work = cfg["long_s"] if n == 0 and cfg.get("long_s") else (lo, hi)
        conn: list = []
        k = 0
        while not stop.is_set():
            k += 1
            rid = f"{pod}.{os.getpid()}.{n}.{k}"  # unique across restarts of the pod
            lane, pool = rng.choice(cfg["lanes"]), rng.choice(cfg["pools"])
            step_usd, cost_usd = rng.randint(1, 999) / 1e6, rng.randint(1, 9999) / 1e6
            # half the rounds declare a size: the cap line's count, index and clock go through every
            # fault too (the checker's doctor holds them to the seats)
            tokens = rng.randint(100, 5000) if rng.random() < 0.5 else None
            journal("ask", id=rid, lane=lane, pool=pool)
            entered = False
            try:
                # the pod calls whatever pool its round runs on (r.pool): it may move anywhere
                with adm.round(lane=lane, model=pool, round_id=rid, timeout=cfg.get("round_timeout", 30),
                               tokens=tokens, move_to=lambda _pool: True) as r:
                    entered = True
                    d = r.decision
                    journal("admitted", id=rid, seq=r.seat.seq, reason=d.reason, running=d.running,
                            slots=d.slots, pool=r.pool, lane=d.lane)
                    if cfg.get("provider"):
                        call_provider(conn, cfg["provider"], r.pool)
                    journal("charge", id=rid, usd=step_usd)
                    r.charge(step_usd, key="step")
                    took = rng.uniform(*work)
                    time.sleep(took / 2)
                    if tokens:  # halfway, a declared round reports its progress (best effort)
                        try:
                            r.progress(tokens / 2)
                        except AdmissionError as exc:
                            journal("progress-lost", id=rid, error=type(exc).__name__)
                    time.sleep(took / 2)
                    r.cost_usd = cost_usd
                    if tokens:  # a declared size is a budget: the round received less (the outbox keeps it)
                        r.received = rng.randint(tokens // 2, tokens)
                    journal("cost", id=rid, usd=cost_usd)
                journal("released", id=rid)
            except AdmissionError as exc:
                journal("failed" if entered else "shed", id=rid, error=type(exc).__name__, msg=str(exc)[:200])
                if not entered:
                    time.sleep(0.05)
            except Exception as exc:  # a provider error: the round ended with it (round() classified it)
                journal("failed" if entered else "shed", id=rid, error=type(exc).__name__, msg=str(exc)[:200])
                if not entered:
                    time.sleep(0.05)

    threads = [threading.Thread(target=worker, args=(n,), daemon=True) for n in range(cfg.get("threads", 3))]
    for t in threads:
        t.start()
    journal("started")
    while not stop.is_set():
        stop.wait(0.1)
    for t in threads:
        t.join(timeout=60)
    deadline = time.monotonic() + 20
    pending = adm.flush()
    while pending and time.monotonic() < deadline:
        time.sleep(0.2)
        pending = adm.flush()
    journal("exit", pending=pending)
    adm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
