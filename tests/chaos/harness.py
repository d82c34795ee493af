"""The chaos harness: a fleet of real pod processes, an invariant checker sampling atomic
snapshots, and the analysis that turns journals and samples into figures.

* `Fleet` starts pod processes (tests/chaos/pod.py) and signals them (SIGKILL, SIGSTOP/SIGCONT,
  SIGTERM for a graceful end); each writes a journal of what it asked, got, charged and ended.
* `Checker` samples the mesh every `every` seconds in one MULTI/EXEC (the census rebuilt now, the
  doctor, every seat record with its lease): the doctor must find nothing and the counts must
  equal the records in every sample it could take; a sample that meets an unreachable server is
  counted, not fatal (faults make the server unreachable on purpose).
* `analyze` reads the journals and samples: over-admissions (a pool running more seats than its
  slots, beyond what the overdraft and re-asserted seats explain), rounds seated twice, the ledger
  against the sum of every distinct charge the pods made, rounds shed and the outage window.
"""
from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import redis

from admission import Admission
from admission import doctor
from admission import scripts as adm_scripts
from admission.client import fail_fast_options
from admission.core import decode_census
from admission.tools.proxy import FaultProxy

from acl import ADMIN_PW, ADMIN_USER, POD_PW, POD_USER, acl_lines, apply_acl
from helpers import RECORDS_LUA

ROOT = Path(__file__).resolve().parents[2]
POD_SCRIPT = Path(__file__).resolve().parent / "pod.py"

LANES = {"ci": {"floor": 0.5, "weight": 2, "priority": 3},
         "review": {"floor": 0.25, "weight": 1, "priority": 2},
         "batch": {"floor": 0.0, "weight": 1, "priority": 1}}
POOLS = ("m1@p1", "m2@p2")
SLOTS = 4  # per pool: seed = max estimate, so a pool's slots are known and fixed


def chaos_policy(lease_ttl: float = 1.5, **tunables: Any) -> dict:
    """Fixed slots per pool (the provider's capacity is above them, so no 429 moves them), a
    short lease and a fast pool clock: faults heal within seconds."""
    return {"tunables": {"seed_estimate": SLOTS, "max_estimate": SLOTS, "lease_ttl": lease_ttl,
                         "grow_interval": 0.5, **tunables},
            "lanes": LANES, "providers": {p.rpartition("@")[2]: {} for p in POOLS},
            "pools": {p: {} for p in POOLS}}


def secure(*clients: redis.Redis) -> None:
    """The deploy file's users on each server (the pods run as the pod user, least privilege)."""
    for c in clients:
        apply_acl(c, acl_lines())


def admin(client: redis.Redis, mesh: str) -> Admission:
    return Admission(client, mesh=mesh, pod="operator", background=False)


# ---------------------------------------------------------------------------------------------
# Pods


@dataclass
class Pod:
    name: str
    cfg: dict
    proc: subprocess.Popen | None = None
    stopped: bool = False

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid


class Fleet:
    """N pod processes of one mesh. `where` says how a pod reaches Redis: {"url": ...} or
    {"sentinels": [...], "master": ...} or {"cluster_nodes": [...]}, or a callable of the pod's
    index giving that (one proxy per pod)."""

    def __init__(self, tmp: Path, mesh: str, *, pods: int = 3, threads: int = 3,
                 where: dict | Callable[[int], dict], provider: str | None = None,
                 pools: tuple[str, ...] = POOLS, lanes: tuple[str, ...] = tuple(LANES),
                 work_s: tuple[float, float] = (0.02, 0.08), outbox: bool = True, acl: bool = True,
                 extra: Callable[[int], dict] | None = None):
        self.tmp, self.mesh = Path(tmp), mesh
        self.journal = self.tmp / "journal.jsonl"
        self.pods: list[Pod] = []
        for i in range(pods):
            cfg = {"mesh": mesh, "pod": f"pod{i}", "lanes": list(lanes), "pools": list(pools),
                   "threads": threads, "seed": i + 1, "journal": str(self.journal),
                   "outbox": str(self.tmp / f"pod{i}.outbox") if outbox else None,
                   "provider": provider, "work_s": list(work_s), "round_timeout": 30,
                   **(where(i) if callable(where) else where), **(extra(i) if extra else {})}
            if acl:
                cfg.update(username=POD_USER, password=POD_PW)
            self.pods.append(Pod(cfg["pod"], cfg))

    def start(self, ready_timeout: float = 30.0) -> "Fleet":
        for pod in self.pods:
            self._spawn(pod)
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline:
            started = {e["pod"] for e in self.events() if e["ev"] == "started"}
            if started >= {p.name for p in self.pods}:
                return self
            for pod in self.pods:
                if pod.proc.poll() is not None:
                    raise RuntimeError(f"{pod.name} exited with {pod.proc.returncode}: {self._log(pod)}")
            time.sleep(0.05)
        raise RuntimeError("pods did not start in time")

    def _spawn(self, pod: Pod) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
        log = open(self.tmp / f"{pod.name}.log", "ab")
        pod.proc = subprocess.Popen([sys.executable, str(POD_SCRIPT), json.dumps(pod.cfg)], env=env,
                                    stdout=log, stderr=subprocess.STDOUT, cwd=str(ROOT))
        log.close()
        pod.stopped = False

    def _log(self, pod: Pod) -> str:
        path = self.tmp / f"{pod.name}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def kill(self, i: int) -> float:
        os.kill(self.pods[i].pid, signal.SIGKILL)
        self.pods[i].proc.wait(timeout=10)
        return time.time()

    def freeze(self, i: int) -> float:
        os.kill(self.pods[i].pid, signal.SIGSTOP)
        self.pods[i].stopped = True
        return time.time()

    def thaw(self, i: int) -> float:
        os.kill(self.pods[i].pid, signal.SIGCONT)
        self.pods[i].stopped = False
        return time.time()

    def restart(self, i: int) -> None:
        """A new process with the same name and outbox (a pod restarted in place replays it)."""
        self._spawn(self.pods[i])

    def stop(self, timeout: float = 60.0) -> None:
        """End every live pod gracefully (SIGTERM: finish the rounds, replay the outbox, exit)."""
        for pod in self.pods:
            if pod.proc and pod.proc.poll() is None:
                if pod.stopped:
                    self.thaw(self.pods.index(pod))
                pod.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for pod in self.pods:
            if pod.proc:
                try:
                    pod.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pod.proc.kill()
                    raise AssertionError(f"{pod.name} did not end within {timeout}s: {self._log(pod)}")

    def close(self) -> None:
        for pod in self.pods:
            if pod.proc and pod.proc.poll() is None:
                if pod.stopped:
                    os.kill(pod.pid, signal.SIGCONT)
                pod.proc.kill()
                pod.proc.wait(timeout=10)

    def __enter__(self) -> "Fleet":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def events(self) -> list[dict]:
        if not self.journal.exists():
            return []
        out = []
        for line in self.journal.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:  # a line torn by SIGKILL mid-write: nothing the checker relies on
                pass
        return out


# ---------------------------------------------------------------------------------------------
# The checker




def _s(x) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


@dataclass
class Sample:
    t: float
    seats: list[tuple[str, str, str, str, int]]  # id, lane, pool, pod, seq
    tickets: list[tuple[str, str, str, str]]
    slots: dict[str, int]
    # the server's reason for each admission streamed since the last sample ({round id: reason}):
    # a pod whose admit reply was lost learns only "same-intent" when it asks again
    admitted: dict[str, str] = field(default_factory=dict)
    last_event: str = "-"


def take_sample(client: redis.Redis, mesh: str, since: str = "-") -> Sample:
    """One atomic read: census (rebuilt now), doctor, records, and the `admitted` events after
    `since`. Raises AssertionError when the doctor or the counts disagree with the records."""
    config = f"adm:{{{mesh}}}:config"
    pipe = client.pipeline(transaction=True)
    adm_scripts.pipe_call(pipe, "census", [config], [""])
    adm_scripts.pipe_call(pipe, "doctor", [config], [])
    pipe.eval(RECORDS_LUA, 1, config)
    pipe.xrange(f"adm:{{{mesh}}}:events", since if since == "-" else f"({since}", "+")
    census, report, (seats, tickets), streamed = pipe.execute()
    t = time.time()
    streamed_fields = ({_s(k): _s(v) for k, v in f.items()} for _, f in streamed)
    admitted = {f["round"]: f["reason"] for f in streamed_fields if f.get("kind") == "admitted"}
    last_event = _s(streamed[-1][0]) if streamed else since
    census, report = decode_census(census), doctor.decode(report)
    assert report.ok, doctor.render(report)
    seats = [(_s(a), _s(b), _s(c), _s(d), int(_s(e) or 0)) for a, b, c, d, e in seats]
    tickets = [tuple(_s(x) for x in row) for row in tickets]
    assert all(s[1] for s in seats), f"a leased seat without its record: {seats}"
    assert all(x[1] for x in tickets), f"a leased ticket without its record: {tickets}"
    slots = {}
    for row in census["pools"]:
        slots[row["pool"]] = row["slots"]
        running = sum(1 for s in seats if s[2] == row["pool"])
        waiting = sum(1 for x in tickets if x[2] == row["pool"])
        assert row["running"] == running, (row["pool"], row["running"], running)
        assert row["waiting"] == waiting, (row["pool"], row["waiting"], waiting)
    return Sample(t, seats, tickets, slots, admitted, last_event)


class Checker:
    """Samples in a thread until stopped. `connect()` gives the client to sample with (called
    again after an error, so a failover's new primary is found)."""

    def __init__(self, connect: Callable[[], redis.Redis], mesh: str, every: float = 0.05):
        self.connect, self.mesh, self.every = connect, mesh, every
        self.samples: list[Sample] = []
        self.reasons: dict[str, str] = {}  # the server's admission reason of every round id
        self.unreachable = 0
        self.violations: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="chaos-checker")
        self._client: redis.Redis | None = None
        self._since = "-"

    def start(self) -> "Checker":
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self._client is None:
                    self._client = self.connect()
                sample = take_sample(self._client, self.mesh, self._since)
                self._since = sample.last_event
                self.reasons.update(sample.admitted)
                self.samples.append(sample)
            except AssertionError as exc:
                self.violations.append(f"{time.time():.3f} {exc}")
            except (redis.RedisError, OSError, IndexError, ValueError) as exc:
                # unreachable, loading, no library or policy yet (a wiped server): not a sample
                self.unreachable += 1
                if isinstance(exc, (redis.ConnectionError, redis.TimeoutError, OSError)):
                    self._client = None
            self._stop.wait(self.every)

    def stop(self) -> "Checker":
        self._stop.set()
        self._thread.join(timeout=10)
        return self

    def __enter__(self) -> "Checker":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# ---------------------------------------------------------------------------------------------
# Analysis


def ledger_micro(client: redis.Redis, mesh: str) -> int:
    """The whole ledger in micro-USD: every day's `*|<provider>` entries."""
    total = 0
    for k in client.scan_iter(match=f"adm:{{{mesh}}}:spend:*"):
        for f, v in client.hgetall(k).items():
            if _s(f).startswith("*|"):
                total += int(_s(v))
    return total


@dataclass
class Figures:
    rounds_done: int = 0
    rounds_failed: int = 0
    rounds_shed: int = 0
    admitted: int = 0
    over_admissions: int = 0  # samples where a pool ran more seats than slots, unexplained
    over_admission_detail: list[str] = field(default_factory=list)
    overdraft_seats: int = 0
    reasserted: int = 0
    seated_twice: int = 0
    expected_micro: int = 0  # every distinct charge the pods announced
    samples: int = 0
    unreachable_samples: int = 0

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d["over_admission_detail"] = d["over_admission_detail"][:5]
        return d


def analyze(events: list[dict], samples: list[Sample], unreachable: int = 0,
            server_reasons: dict[str, str] | None = None) -> Figures:
    """``server_reasons``: the reason the server streamed for each admission (Checker.reasons);
    it explains a seat whose pod only heard "same-intent" after its admit reply was lost."""
    f = Figures(samples=len(samples), unreachable_samples=unreachable)
    reason: dict[tuple[str, int], str] = {}
    seqs: dict[str, set] = defaultdict(set)
    reasserted: set[str] = set()
    for e in events:
        ev = e["ev"]
        if ev == "admitted":
            f.admitted += 1
            reason[(e["id"], e["seq"])] = e["reason"]
            seqs[e["id"]].add(e["seq"])
        elif ev == "released":
            f.rounds_done += 1
        elif ev == "failed":
            f.rounds_failed += 1
        elif ev == "shed":
            f.rounds_shed += 1
        elif ev == "reasserted":
            reasserted.update(e["ids"])
        elif ev in ("charge", "cost"):
            f.expected_micro += round(e["usd"] * 1_000_000)
    f.reasserted = len(reasserted)
    f.seated_twice = sum(1 for s in seqs.values() if len(s) > 1)
    overdraft = {k[0] for k, r in reason.items() if r == "overdraft"}
    overdraft |= {rid for rid, r in (server_reasons or {}).items() if r == "overdraft"}
    f.overdraft_seats = len(overdraft)
    for s in samples:
        by_pool: dict[str, list] = defaultdict(list)
        for seat in s.seats:
            by_pool[seat[2]].append(seat)
        for pool, seats in by_pool.items():
            extra = len(seats) - s.slots.get(pool, 0)
            if extra <= 0:
                continue
            explained = sum(1 for seat in seats
                            if seat[0] in overdraft or seat[0] in reasserted)
            if extra > explained:
                f.over_admissions += 1
                f.over_admission_detail.append(
                    f"{s.t:.3f} {pool}: {len(seats)} seats > {s.slots.get(pool)} slots, {explained} explained: "
                    + ", ".join(f"{x[0]}#{x[4]}:{reason.get((x[0], x[4]), '?')}/{(server_reasons or {}).get(x[0], '?')}"
                               for x in seats))
    return f


def judge(fleet: Fleet, checker: Checker, client: redis.Redis, *, drained: bool = True) -> tuple[Figures, int]:
    """What every fault must leave true: each sample the checker took was consistent, no pool
    ran over its slots beyond the overdraft and re-assertions, no round was seated twice, and
    (``drained``) every pod ended with an empty outbox. Returns the figures and the ledger."""
    events = fleet.events()
    f = analyze(events, checker.samples, checker.unreachable, checker.reasons)
    assert not checker.violations, checker.violations[:3]
    assert f.over_admissions == 0, f.over_admission_detail[:3]
    assert f.seated_twice == 0
    if drained:
        assert all(e["pending"] == 0 for e in events if e["ev"] == "exit"), [e for e in events if e["ev"] == "exit"]
    return f, ledger_micro(client, fleet.mesh)


@contextmanager
def proxies(server, n: int) -> Iterator[list[FaultProxy]]:
    """One FaultProxy per pod in front of the server, stopped on the way out."""
    started = [FaultProxy("127.0.0.1", server.port).start() for _ in range(n)]
    try:
        yield started
    finally:
        for p in started:
            p.stop()


def in_flight_micro(events: list[dict]) -> int:
    """What rounds that never ended (a killed pod's, a wipe's) announced: booked or not."""
    ended = {e["id"] for e in events if e["ev"] in ("released", "failed", "shed")}
    return sum(round(e["usd"] * 1e6) for e in events if e["ev"] in ("charge", "cost") and e["id"] not in ended)


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def wait_until(pred: Callable[[], Any], timeout: float, every: float = 0.05, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def root_client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, **fail_fast_options())


def admin_client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, username=ADMIN_USER, password=ADMIN_PW, **fail_fast_options())
