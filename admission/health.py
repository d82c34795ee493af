"""Health samplers (docs/design.md §8, the fence between planes): read each pool's ``health_url``
(a vLLM-style Prometheus ``/metrics``) and write its sample with ``report_health``.

A sample is a lease: it counts as capacity for the pool's ``health_max_age`` and then ages out.
So a sampler that fails (refused, timed out, not 200, unparsable) writes nothing: the last
sample ages out and the plane sheds borrows. A failure is a warning on the ``admission.health``
logger, never a sample that claims capacity.

Only the standard library is used (``urllib.request``, which honours ``http_proxy`` /
``no_proxy`` as usual): no new runtime dependency.

    admission health run [--once] [--every SECONDS] --url ... --mesh prod
"""
from __future__ import annotations

import argparse
import asyncio
import http.client
import math
import re
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import redis

from ._log import get_logger
from .core import UNREACHABLE
from .errors import AdmissionError, BadArgument, Unavailable
from .policy import TUNABLES

log = get_logger("admission.health")

WAITING = "vllm:num_requests_waiting"  # depth: requests queued at the server
RUNNING = "vllm:num_requests_running"
#: The most of a /metrics body a sampler reads (bytes): vLLM's, histograms included, is a few
#: hundred KB; anything far larger is not what we are looking for.
MAX_BODY = 16 << 20
#: How long the forever loop sleeps when no pool has a health_url (it re-reads the policy).
IDLE = 5.0

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


class SampleError(AdmissionError):
    """A sampler could not read its plane; nothing is written for it."""

    def __init__(self, pool: str, reason: str):
        super().__init__(f"{pool}: {reason}")
        self.pool, self.reason = pool, reason


@dataclass(frozen=True)
class Sample:
    """One health sample of a plane: requests waiting (depth) and running (None: unknown), whether
    the plane answered, and when it was taken (epoch seconds)."""

    pool: str
    depth: int
    running: int | None
    ok: bool
    at: float


@runtime_checkable
class Sampler(Protocol):
    """Reads one pool's health every ``every`` seconds; ``sample()`` raises ``SampleError``."""

    pool: str
    every: float

    def sample(self) -> Sample: ...


# -- parsing -------------------------------------------------------------------------------------

def parse_vllm_metrics(text: str) -> tuple[int, int]:
    """(depth, running) from Prometheus text: the sums of ``vllm:num_requests_waiting`` and
    ``vllm:num_requests_running`` over all their label sets (vLLM labels them by model_name).
    A metric that is absent counts 0; ``ValueError`` when both are absent or a value of theirs
    is not a finite number >= 0."""
    totals: dict[str, float | None] = {WAITING: None, RUNNING: None}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _NAME.match(line)
        if m is None or m.group() not in totals:
            continue  # another metric (or a line we need not understand)
        totals[m.group()] = (totals[m.group()] or 0.0) + _value(line, m.end(), m.group(), n)
    if totals[WAITING] is None and totals[RUNNING] is None:
        raise ValueError(f"no {WAITING} or {RUNNING} sample in the metrics text (not a vLLM /metrics page?)")
    return round(totals[WAITING] or 0.0), round(totals[RUNNING] or 0.0)


def _value(line: str, start: int, name: str, n: int) -> float:
    rest = line[start:]
    if rest.startswith("{"):
        # a label value may hold spaces, but the value and timestamp never hold a '}'
        close = rest.rfind("}")
        if close < 0:
            raise ValueError(f"line {n}: {name} has unclosed labels: {line[:120]!r}")
        rest = rest[close + 1:]
    fields = rest.split()
    try:
        v = float(fields[0])
    except (IndexError, ValueError):
        raise ValueError(f"line {n}: {name} has no number: {line[:120]!r}") from None
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"line {n}: {name} must be a finite number >= 0, got {fields[0]}")
    return v


# -- the vLLM sampler ----------------------------------------------------------------------------

class VllmSampler:
    """A pool's health from its vLLM server's ``/metrics``: one GET per ``sample()``."""

    def __init__(self, pool: str, url: str, every: float, timeout: float = 2.0,
                 clock: Callable[[], float] = time.time) -> None:
        if not isinstance(url, str) or not re.match(r"^https?://[^\s/]+", url):
            raise BadArgument(f"health_url of {pool} must be an http(s) URL, got {url!r}")
        for what, v in (("every", every), ("timeout", timeout)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise BadArgument(f"{what} must be > 0 seconds, got {v!r}")
        self.pool, self.url, self.every, self.timeout = pool, url, float(every), float(timeout)
        self._clock = clock

    def __repr__(self) -> str:
        return f"VllmSampler(pool={self.pool!r}, url={self.url!r}, every={self.every!r})"

    def sample(self) -> Sample:
        # taken before the GET: the lease starts no later than what it describes
        at = self._clock()
        depth, running = self._parse(self._get())
        return Sample(self.pool, depth, running, True, at)

    def _get(self) -> bytes:
        req = urllib.request.Request(self.url, headers={"Accept": "text/plain", "User-Agent": "admission-health"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:  # noqa: S310 - http(s) only
                if resp.status != 200:
                    raise SampleError(self.pool, f"HTTP {resp.status} from {self.url}")
                raw = resp.read(MAX_BODY + 1)
        except urllib.error.HTTPError as exc:
            raise SampleError(self.pool, f"HTTP {exc.code} from {self.url}") from None
        except (TimeoutError, urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(exc, TimeoutError) or isinstance(reason, TimeoutError):
                raise SampleError(self.pool, f"timed out after {self.timeout:g} s reading {self.url}") from None
            raise SampleError(self.pool, f"unreachable {self.url}: {reason}") from None
        if len(raw) > MAX_BODY:
            raise SampleError(self.pool, f"body of {self.url} over {MAX_BODY} bytes")
        return raw

    def _parse(self, raw: bytes) -> tuple[int, int]:
        try:
            return parse_vllm_metrics(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise SampleError(self.pool, f"unparsable metrics from {self.url}: {exc}") from None


def samplers_from_policy(policy: dict[str, Any], *, every: float | None = None,
                         timeout: float = 2.0) -> list[VllmSampler]:
    """One sampler per pool with a ``health_url``, every ``health_every`` seconds (else a third of
    its ``health_max_age``, else of the tunable), so a sample is renewed about three times per
    lease. ``every`` overrides them all. The timeout is at most the period: a hung server must
    not hold the other pools' samples back until theirs age out."""
    default_age = (policy.get("tunables") or {}).get("health_max_age", TUNABLES["health_max_age"][0])
    out = []
    for p in policy.get("pools") or []:
        if not p.get("health_url"):
            continue
        period = every or p.get("health_every") or p.get("health_max_age", default_age) / 3
        out.append(VllmSampler(p["name"], p["health_url"], period, timeout=min(timeout, period)))
    return out


# -- running them --------------------------------------------------------------------------------

class SamplerRun:
    """Drives samplers on a monotonic clock (a pod's clock or the CLI): ``due()`` says which to run,
    ``run_once()`` / ``arun_once()`` sample them and write the successes. ``failures`` holds the
    last run's failures as {pool: reason}."""

    def __init__(self, samplers: Iterable[Sampler], max_workers: int = 8) -> None:
        self.samplers = list(samplers)
        self.max_workers = max_workers
        self.failures: dict[str, str] = {}
        self._last: dict[int, float] = {}  # sampler index -> monotonic time it was last due

    def due(self, now_monotonic: float) -> list[Sampler]:
        """The samplers due at ``now_monotonic`` (never run, or run ``every`` seconds ago or more);
        they count as run from now on."""
        out = []
        for i, s in enumerate(self.samplers):
            last = self._last.get(i)
            if last is None or now_monotonic - last >= s.every:
                self._last[i] = now_monotonic
                out.append(s)
        return out

    def next_due(self, now_monotonic: float) -> float:
        """Seconds until the next sampler is due (0: one is due now; IDLE without samplers)."""
        waits = [max(0.0, self._last[i] + s.every - now_monotonic) if i in self._last else 0.0
                 for i, s in enumerate(self.samplers)]
        return min(waits, default=IDLE)

    def run_once(self, adm: Any, samplers: Iterable[Sampler] | None = None, *,
                 now: float | None = None) -> list[Sample]:
        """Sample ``samplers`` (default: the due ones) concurrently, so one hung server costs one
        timeout, and write each success with ``adm.report_health``; returns the samples written.
        ``now`` is passed to ``report_health`` (a mesh with clock = "caller")."""
        chosen = self.due(time.monotonic()) if samplers is None else list(samplers)
        if not chosen:
            return self._begin([])
        with ThreadPoolExecutor(max_workers=max(1, min(self.max_workers, len(chosen))),
                                thread_name_prefix="admission-health") as pool:
            got = self._begin(list(pool.map(_take, chosen)))
        written = []
        for s in got:
            try:
                adm.report_health(s.pool, depth=s.depth, running=s.running, ok=s.ok, at=s.at, now=now)
                written.append(s)
            except AdmissionError as exc:
                self._write_failed(s, exc)
        return written

    async def arun_once(self, adm: Any, samplers: Iterable[Sampler] | None = None, *,
                        now: float | None = None) -> list[Sample]:
        """``run_once`` for an ``AsyncAdmission``: the blocking GETs run in threads, together."""
        chosen = self.due(time.monotonic()) if samplers is None else list(samplers)
        got = self._begin(list(await asyncio.gather(*(asyncio.to_thread(_take, s) for s in chosen))))
        written = []
        for s in got:
            try:
                await adm.report_health(s.pool, depth=s.depth, running=s.running, ok=s.ok, at=s.at, now=now)
                written.append(s)
            except AdmissionError as exc:
                self._write_failed(s, exc)
        return written

    def _begin(self, results: list[Sample | SampleError]) -> list[Sample]:
        """A new run: log and keep its failures; the samples to write."""
        self.failures = {}
        for r in results:
            if isinstance(r, SampleError):
                log.warning("health_sample_failed", pool=r.pool, reason=r.reason)
                self.failures[r.pool] = r.reason
        return [r for r in results if isinstance(r, Sample)]

    def _write_failed(self, s: Sample, exc: AdmissionError) -> None:
        # Redis down, or the pool left the policy: the sample is lost, the plane ages out
        log.warning("health_write_failed", pool=s.pool, error=f"{type(exc).__name__}: {exc}")
        self.failures[s.pool] = f"write: {type(exc).__name__}: {exc}"


def _take(sampler: Sampler) -> Sample | SampleError:
    """One sample, or its failure as a value (a third-party sampler that raises anything else, or
    returns something else, is a failure too: it must never stop the other samplers)."""
    pool = getattr(sampler, "pool", repr(sampler))
    try:
        got = sampler.sample()
    except SampleError as exc:
        return exc
    except Exception as exc:  # noqa: BLE001
        return SampleError(pool, f"sampler raised {type(exc).__name__}: {exc}")
    if not isinstance(got, Sample):
        return SampleError(pool, f"sampler returned {type(got).__name__}, not a Sample")
    return got


# -- the CLI: admission health run ---------------------------------------------------------------

def _positive(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {s!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0 seconds, got {s}")
    return v


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """The ``health`` subcommand on ``sub`` (an argparse subparsers object); returns its parser, for
    the caller to add the connection arguments and the function to run."""
    p = sub.add_parser("health", help="health samplers: `health run` reads each pool's health_url "
                                      "and writes its sample (a failed read writes nothing)")
    p.add_argument("action", choices=["run"])
    p.add_argument("--once", action="store_true", help="sample every pool once and exit (exit 1 if one failed)")
    p.add_argument("--every", type=_positive, default=None, metavar="SECONDS",
                   help="sample every pool this often (default: each pool's health_every)")
    return p


def run_cli(args: argparse.Namespace, adm: Any, *, sleep: Callable[[float], None] = time.sleep) -> int:
    """``admission health run``: exit 0; 1 with ``--once`` when a sampler failed; 2 when no pool
    of the policy has a health_url. Without ``--once`` it runs until Ctrl-C, re-reading the
    policy when its version changes."""
    try:
        policy = adm.policy()
    except UNREACHABLE as exc:  # the CLI's "Redis unreachable" (exit 3), not a traceback
        raise Unavailable(f"admission unavailable: {exc}") from exc
    run = SamplerRun(samplers_from_policy(policy, every=args.every))
    if not run.samplers:
        print(f"admission health: no pool of mesh {getattr(args, 'mesh', '?')} has a health_url", file=sys.stderr)
        return 2
    if args.once:
        _print(run.run_once(adm, run.samplers), run.failures)
        return 1 if run.failures else 0
    version = policy.get("version")
    try:
        while True:
            _print(run.run_once(adm), run.failures)
            sleep(run.next_due(time.monotonic()))
            policy = _policy_or_none(adm)
            if policy is not None and policy.get("version") != version:  # new pools, urls, periods
                version, run = policy.get("version"), SamplerRun(samplers_from_policy(policy, every=args.every))
                print(f"policy version {version}: sampling {len(run.samplers)} pool(s)", flush=True)
    except KeyboardInterrupt:
        return 0


def _policy_or_none(adm: Any) -> dict[str, Any] | None:
    # a Redis blip must not stop the sampler: keep the samplers it has (their writes fail and are
    # printed until Redis is back)
    try:
        return adm.policy()
    except (redis.RedisError, AdmissionError) as exc:
        log.warning("health_policy_unreadable", error=f"{type(exc).__name__}: {exc}")
        return None


def _print(written: list[Sample], failures: dict[str, str]) -> None:
    for s in written:
        running = "?" if s.running is None else s.running
        print(f"{s.pool} depth={s.depth} running={running} {'ok' if s.ok else 'not-ok'}", flush=True)
    for pool, reason in failures.items():
        print(f"{pool} FAILED: {reason}", flush=True)
