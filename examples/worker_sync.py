"""An agent worker (threads): takes items from a Redis queue and runs each as a round through the
openai SDK, admitted by the mesh (``admission.integrations.openai.wrap``).

    ADMISSION_URL=redis://127.0.0.1:6379/0 ADMISSION_MESH=demo ADMISSION_POD=worker-1 \\
    OPENAI_BASE_URL=http://127.0.0.1:8400/v1 OPENAI_API_KEY=demo \\
        python examples/worker_sync.py --queue jobs --model sonnet --provider fake --threads 4

The queue: items are JSON ``{"id": ..., "lane": ..., "prompt": ...}`` pushed (LPUSH) on
``work:<queue>``; each result, JSON ``{"id", "lane", "ok", "answer", "tokens", "seconds",
"round_id", "pod"}``, is pushed on ``done:<queue>``. One log line per item.

Choices:

* **One item, one round, round id = the item id.** An item that has to run again (put back, see
  below) runs as ``<id>#<attempt>``: a round id names one round (in the census, the events and
  the logs, each attempt is told apart).
* **Nothing is lost in between.** A worker takes an item with ``BLMOVE work:<queue> ->
  processing:<queue>:<pod>`` (the reliable-queue pattern) and settles it with one small Lua
  script: it leaves ``processing`` and goes to ``done`` (or back to ``work``) in one step, and
  only if it is still there, so whoever settles first wins (a worker finishing, or the main
  thread putting back what a worker still held at exit). A worker starting under a pod name
  whose ``processing`` list has items (a crash) puts them back first: give each worker a stable
  ``ADMISSION_POD`` (a StatefulSet's pod name).
* **Refusals.** The wrapper retries the provider's load refusals (429/529) in new admitted rounds
  (``--retries``); an item that still fails, or meets another error, goes back to the end of the
  queue until it has failed ``--attempts`` times, then is done with ``"ok": false``. A round that
  waited ``--wait`` seconds for a seat (``WaitTimeout``; its waiter ticket is withdrawn) goes back
  too.
* **SIGTERM / SIGINT: finish or give back, never leak.** The worker takes no new item; a round in
  a provider call finishes and its item is done; a round seated from now on does not call the
  provider (the HTTP transport refuses to send: the SDK raises ``APIConnectionError`` and the
  round is released as an ``error``) and its item goes back. Either way ``round()`` releases the
  seat. After ``--grace`` seconds the main thread puts back whatever a thread still holds (one
  still waiting for a seat: a Python thread blocked in a wait cannot be interrupted) and the
  process exits; such a thread's waiter ticket is no seat and expires with its lease
  (``lease_ttl``). The asyncio worker (``worker_async.py``) cancels its waiters instead and
  withdraws their tickets at once.
* **Exit codes**: 0 when the queue was empty (``--exit-when-empty``) or after SIGTERM/SIGINT, 1
  when it cannot start (Redis unreachable, no policy on the mesh), 2 on bad arguments.

Configuration: ``ADMISSION_URL``, ``ADMISSION_MESH``, ``ADMISSION_POD`` (the admission);
``OPENAI_BASE_URL``, ``OPENAI_API_KEY`` (read by the SDK itself); the flags (``--help``).
``--metrics-port PORT`` serves the pod's own gauges on ``0.0.0.0:PORT/metrics``
(``admission.pod_metrics``: its ledger records waiting for Redis, seats held, waiters; the
``serve`` extra); off by default.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from typing import Any

import httpx
import openai
import redis

from admission import Admission, WaitTimeout
from admission.errors import AdmissionError
from admission.integrations.openai import wrap
from admission.pod_metrics import start_metrics_server

log = logging.getLogger("worker")

#: Settle an item: take it out of ``processing`` and push what replaces it, in one step, only if
#: it is still there (1) -- else someone else settled it first (0).
SETTLE = """
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 1 then
  redis.call(ARGV[3], KEYS[2], ARGV[2])
  return 1
end
return 0
"""


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--queue", default="jobs", help="take items from work:QUEUE, push results on done:QUEUE")
    p.add_argument("--model", default="sonnet", help="the model to call (default %(default)s)")
    p.add_argument("--provider", default=os.environ.get("ADMISSION_PROVIDER", "openai"),
                   help="the provider part of the pool name MODEL@PROVIDER (default $ADMISSION_PROVIDER or "
                        "%(default)s)")
    p.add_argument("--pool", default=None, help="the admission pool to ask for (default MODEL@PROVIDER)")
    p.add_argument("--lane", default="bugfix", help="the lane of items that name none (default %(default)s)")
    p.add_argument("--threads", type=int, default=4, help="worker threads (default %(default)s)")
    p.add_argument("--max-tokens", type=int, default=1024, help="max_tokens of each call (default %(default)s)")
    p.add_argument("--retries", type=int, default=2, help="load refusals retried per item by the wrapper")
    p.add_argument("--attempts", type=int, default=3,
                   help="failed attempts per item before it is done as failed (default %(default)s)")
    p.add_argument("--wait", type=float, default=600.0, help="seconds a round may wait for a seat")
    p.add_argument("--grace", type=float, default=30.0, help="seconds to finish after SIGTERM/SIGINT")
    p.add_argument("--exit-when-empty", action="store_true", help="exit once the queue is empty (tests, batches)")
    p.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                   help="serve the pod's gauges on 0.0.0.0:PORT/metrics (default: off)")
    args = p.parse_args(argv)
    if args.threads < 1 or args.attempts < 1 or args.max_tokens < 1:
        p.error("--threads, --attempts and --max-tokens must be at least 1")
    return args


class Gate(httpx.HTTPTransport):
    """The SDK's HTTP transport, refusing to send once the worker stops: a round seated after
    SIGTERM ends at once (released by ``round()``) instead of starting a call."""

    def __init__(self, stop: threading.Event):
        super().__init__()
        self.stop = stop

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self.stop.is_set():
            raise httpx.ConnectError("the worker is stopping", request=request)
        return super().handle_request(request)


class Queue:
    """``work:<q>`` -> ``processing:<q>:<pod>`` -> ``done:<q>`` (or back to ``work:<q>``)."""

    def __init__(self, client: redis.Redis, name: str, pod: str):
        self.client, self.work, self.done = client, f"work:{name}", f"done:{name}"
        self.processing = f"processing:{name}:{pod}"
        self._settle = client.register_script(SETTLE)

    def recover(self) -> int:
        """Put back what an earlier run of this pod held when it died."""
        n = 0
        while self.client.lmove(self.processing, self.work, "RIGHT", "RIGHT") is not None:
            n += 1
        return n

    def take(self, timeout: float = 0.5) -> str | None:
        raw = self.client.blmove(self.work, self.processing, timeout, "RIGHT", "LEFT")
        return raw.decode() if isinstance(raw, bytes) else raw

    def finish(self, raw: str, result: dict[str, Any]) -> bool:
        return bool(self._settle(keys=[self.processing, self.done], args=[raw, json.dumps(result), "LPUSH"]))

    def give_back(self, raw: str, item: dict[str, Any], failed: bool = False) -> bool:
        """Back on the queue, its next run a new round (``attempt`` + 1): at the front (taken
        next) when it did not run (shutdown, no seat), at the end when it failed (no hot loop on
        a bad item; ``failures`` + 1)."""
        again = {**item, "attempt": int(item.get("attempt", 1)) + 1}
        if failed:
            again["failures"] = int(item.get("failures", 0)) + 1
        return bool(self._settle(keys=[self.processing, self.work],
                                 args=[raw, json.dumps(again), "LPUSH" if failed else "RPUSH"]))


class Worker:
    def __init__(self, args: argparse.Namespace, adm: Admission, queue: Queue, pod: str):
        self.args, self.queue, self.pod = args, queue, pod
        self.stop = threading.Event()
        self.pool = args.pool or f"{args.model}@{args.provider}"
        # One client for every thread (the SDK's client is thread-safe); its own retries are off
        # in the wrapper, which retries load refusals in new admitted rounds.
        self.client = wrap(openai.OpenAI(http_client=httpx.Client(transport=Gate(self.stop), timeout=600.0)),
                           adm, lane=args.lane, provider=args.provider, pools={args.model: self.pool},
                           retries=args.retries, timeout=args.wait)
        self.held: dict[str, str | None] = {}  # thread name -> the raw item it holds
        self.lock = threading.Lock()

    def run(self) -> None:
        """One thread: take, run, settle, until stopped (or the queue is empty)."""
        name = threading.current_thread().name
        while not self.stop.is_set():
            raw = self.queue.take()
            if raw is None:
                if self.args.exit_when_empty:
                    return
                continue
            if self.stop.is_set():  # taken while stopping: back at once, no round
                self.queue.give_back(raw, json.loads(raw))
                return
            with self.lock:
                self.held[name] = raw
            try:
                self.one(raw)
            finally:
                with self.lock:
                    self.held[name] = None

    def one(self, raw: str) -> None:
        item = json.loads(raw)
        attempt = int(item.get("attempt", 1))
        round_id = str(item["id"]) if attempt == 1 else f"{item['id']}#{attempt}"
        lane = item.get("lane") or self.args.lane
        started = time.monotonic()
        try:
            answer = self.client.chat.completions.create(
                model=self.args.model, messages=[{"role": "user", "content": item.get("prompt", "")}],
                max_tokens=self.args.max_tokens, lane=lane, round_id=round_id)
        except openai.APIConnectionError as exc:
            if self.stop.is_set():  # the gate: seated after SIGTERM, never called
                self.queue.give_back(raw, item)
                log.info("item %s lane %s: given back (seated as the worker stops: not called)", item["id"], lane)
            else:
                self.failed(raw, item, lane, exc)
        except WaitTimeout:
            self.queue.give_back(raw, item)
            log.info("item %s lane %s: no seat within %gs, given back", item["id"], lane, self.args.wait)
        except (openai.APIError, AdmissionError, redis.RedisError) as exc:
            self.failed(raw, item, lane, exc)
        else:
            seconds = round(time.monotonic() - started, 3)
            usage = answer.usage
            result = {"id": item["id"], "lane": lane, "ok": True, "answer": answer.choices[0].message.content,
                      "tokens": usage.completion_tokens if usage else None, "seconds": seconds,
                      "round_id": round_id, "pod": self.pod}
            if self.queue.finish(raw, result):
                log.info("item %s lane %s: done in %.2fs (round %s, %s tokens)", item["id"], lane, seconds,
                         round_id, result["tokens"])
            else:  # the main thread gave it back at the end of the grace: it will run again
                log.info("item %s lane %s: done in %.2fs, but already given back", item["id"], lane, seconds)

    def failed(self, raw: str, item: dict[str, Any], lane: str, exc: BaseException) -> None:
        if self.stop.is_set():  # not the item's fault: it runs again on the next start
            self.queue.give_back(raw, item)
            log.warning("item %s lane %s: failed while stopping (%s), given back", item["id"], lane, exc)
            return
        failures = int(item.get("failures", 0)) + 1
        if failures < self.args.attempts:
            self.queue.give_back(raw, item, failed=True)
            log.warning("item %s lane %s: attempt failed (%s), queued again", item["id"], lane, exc)
            return
        self.queue.finish(raw, {"id": item["id"], "lane": lane, "ok": False, "error": f"{type(exc).__name__}: {exc}",
                                "failures": failures, "pod": self.pod})
        log.error("item %s lane %s: failed %d times, done as failed: %s", item["id"], lane, failures, exc)

    def abandon(self) -> int:
        """At the end of the grace: give back what threads still hold (they wait for a seat)."""
        with self.lock:
            held = [raw for raw in self.held.values() if raw]
        return sum(self.queue.give_back(raw, json.loads(raw)) for raw in held)


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(threadName)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per item, not per request
    url = os.environ.get("ADMISSION_URL", "redis://127.0.0.1:6379/0")
    mesh = os.environ.get("ADMISSION_MESH", "demo")
    pod = os.environ.get("ADMISSION_POD") or f"{socket.gethostname()}-{os.getpid()}"
    adm = Admission.from_url(url, mesh=mesh, pod=pod)
    queue = Queue(redis.Redis.from_url(url, socket_timeout=10), args.queue, pod)
    try:
        if not adm.policy()["version"]:  # fail now, not in every thread
            log.error("cannot start: mesh %s has no policy (admission config apply ...)", mesh)
            return 1
        recovered = queue.recover()
    except (AdmissionError, redis.RedisError) as exc:
        log.error("cannot start: %s", exc)
        return 1
    worker = Worker(args, adm, queue, pod)
    metrics = None if args.metrics_port is None else start_metrics_server(adm, args.metrics_port)

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("%s: finishing (grace %gs)", signal.Signals(signum).name, args.grace)
        worker.stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    log.info("worker %s on mesh %s, queue %s, pool %s, %d threads%s", pod, mesh, args.queue, worker.pool,
             args.threads, f" ({recovered} item(s) recovered)" if recovered else "")
    threads = [threading.Thread(target=worker.run, name=f"worker-{i + 1}", daemon=True) for i in range(args.threads)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads) and not worker.stop.is_set():
        worker.stop.wait(0.2)
    deadline = time.monotonic() + args.grace
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    if any(t.is_alive() for t in threads):
        log.warning("grace over: %d item(s) given back, still waiting for a seat", worker.abandon())
    adm.close()
    if metrics is not None:
        metrics.stop()
    log.info("worker %s stopped", pod)
    return 0


if __name__ == "__main__":
    sys.exit(main())
