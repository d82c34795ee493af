"""An agent worker (asyncio): takes items from a Redis queue and runs each as a round through the
openai SDK's ``AsyncOpenAI``, admitted by the mesh (``admission.integrations.openai.wrap`` with an
``AsyncAdmission``), ``--tasks`` items at a time.

    ADMISSION_URL=redis://127.0.0.1:6379/0 ADMISSION_MESH=demo ADMISSION_POD=worker-2 \\
    OPENAI_BASE_URL=http://127.0.0.1:8400/v1 OPENAI_API_KEY=demo \\
        python examples/worker_async.py --queue jobs --model sonnet --provider fake --tasks 8

The queue, the results, the round ids, the attempts and the exit codes are ``worker_sync.py``'s
(read its docstring): items ``{"id", "lane", "prompt"}`` on ``work:<queue>``, taken with
``BLMOVE`` into ``processing:<queue>:<pod>``, settled into ``done:<queue>`` (or back) by one Lua
script, one log line per item. What asyncio changes is the shutdown, which is exact here:

* **SIGTERM / SIGINT**: no new item is taken; a task still **waiting for a seat is cancelled at
  once**: the cancellation leaves ``round()``'s wait, which withdraws its waiter ticket, and the
  item goes back to the front of the queue. A task **in a provider call** finishes it (its item
  is done) within ``--grace`` seconds; after that it is cancelled too (``round()`` releases the
  seat) and its item goes back. A round seated in the meantime never calls the provider (the HTTP
  transport refuses once stopping). Nothing is left behind: no seat, no ticket, no item in
  ``processing``.
* A task is told apart by where it is: taking an item (left alone: a cancelled ``BLMOVE`` could
  lose the item it moved; it returns within half a second), waiting in ``round()``, or inside the
  HTTP transport (in a call).

Configuration: ``ADMISSION_URL``, ``ADMISSION_MESH``, ``ADMISSION_POD`` (the admission);
``OPENAI_BASE_URL``, ``OPENAI_API_KEY`` (read by the SDK itself); the flags (``--help``).
``--metrics-port PORT`` serves the pod's own gauges on ``0.0.0.0:PORT/metrics``
(``admission.pod_metrics``: its ledger records waiting for Redis, seats held, waiters; the
``serve`` extra); off by default.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import socket
import sys
import time
from typing import Any

import httpx
import openai
import redis
import redis.asyncio as aredis

from admission import AsyncAdmission, WaitTimeout
from admission.errors import AdmissionError
from admission.integrations.openai import wrap
from admission.pod_metrics import start_metrics_server

log = logging.getLogger("worker")

#: As in worker_sync.py: move an item out of ``processing`` and push its successor, only if it is
#: still there.
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
    p.add_argument("--tasks", "--threads", dest="tasks", type=int, default=8,
                   help="items run at once, one task each (default %(default)s)")
    p.add_argument("--max-tokens", type=int, default=1024, help="max_tokens of each call (default %(default)s)")
    p.add_argument("--retries", type=int, default=2, help="load refusals retried per item by the wrapper")
    p.add_argument("--attempts", type=int, default=3,
                   help="failed attempts per item before it is done as failed (default %(default)s)")
    p.add_argument("--wait", type=float, default=600.0, help="seconds a round may wait for a seat")
    p.add_argument("--grace", type=float, default=30.0, help="seconds the calls in flight get after SIGTERM/SIGINT")
    p.add_argument("--exit-when-empty", action="store_true", help="exit once the queue is empty (tests, batches)")
    p.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                   help="serve the pod's gauges on 0.0.0.0:PORT/metrics (default: off)")
    args = p.parse_args(argv)
    if args.tasks < 1 or args.attempts < 1 or args.max_tokens < 1:
        p.error("--tasks, --attempts and --max-tokens must be at least 1")
    return args


class Gate(httpx.AsyncHTTPTransport):
    """The SDK's HTTP transport: marks the task that is in a provider call (the shutdown lets it
    finish), and refuses to send once the worker stops (a round seated after SIGTERM ends at once:
    the SDK raises ``APIConnectionError`` and ``round()`` releases the seat)."""

    def __init__(self, stop: asyncio.Event, phase: dict[asyncio.Task, str]):
        super().__init__()
        self.stop, self.phase = stop, phase

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.stop.is_set():
            raise httpx.ConnectError("the worker is stopping", request=request)
        task = asyncio.current_task()
        self.phase[task] = "call"
        try:
            return await super().handle_async_request(request)
        finally:
            self.phase[task] = "round"


class Queue:
    """``work:<q>`` -> ``processing:<q>:<pod>`` -> ``done:<q>`` (or back to ``work:<q>``)."""

    def __init__(self, client: aredis.Redis, name: str, pod: str):
        self.client, self.work, self.done = client, f"work:{name}", f"done:{name}"
        self.processing = f"processing:{name}:{pod}"
        self._settle = client.register_script(SETTLE)

    async def recover(self) -> int:
        """Put back what an earlier run of this pod held when it died."""
        n = 0
        while await self.client.lmove(self.processing, self.work, "RIGHT", "RIGHT") is not None:
            n += 1
        return n

    async def take(self, timeout: float = 0.5) -> str | None:
        raw = await self.client.blmove(self.work, self.processing, timeout, "RIGHT", "LEFT")
        return raw.decode() if isinstance(raw, bytes) else raw

    async def finish(self, raw: str, result: dict[str, Any]) -> bool:
        return bool(await self._settle(keys=[self.processing, self.done], args=[raw, json.dumps(result), "LPUSH"]))

    async def give_back(self, raw: str, item: dict[str, Any], failed: bool = False) -> bool:
        """Back on the queue, its next run a new round (``attempt`` + 1): at the front when it
        did not run, at the end when it failed (``failures`` + 1)."""
        again = {**item, "attempt": int(item.get("attempt", 1)) + 1}
        if failed:
            again["failures"] = int(item.get("failures", 0)) + 1
        return bool(await self._settle(keys=[self.processing, self.work],
                                       args=[raw, json.dumps(again), "LPUSH" if failed else "RPUSH"]))


class Worker:
    def __init__(self, args: argparse.Namespace, adm: AsyncAdmission, queue: Queue, pod: str):
        self.args, self.queue, self.pod = args, queue, pod
        self.stop = asyncio.Event()
        self.phase: dict[asyncio.Task, str] = {}  # task -> take | round | call
        self.pool = args.pool or f"{args.model}@{args.provider}"
        # one client for every task; its own retries are off in the wrapper, which retries load
        # refusals in new admitted rounds
        http = httpx.AsyncClient(transport=Gate(self.stop, self.phase), timeout=600.0)
        self.client = wrap(openai.AsyncOpenAI(http_client=http), adm, lane=args.lane, provider=args.provider,
                           pools={args.model: self.pool}, retries=args.retries, timeout=args.wait)

    def stopping(self) -> None:
        """SIGTERM / SIGINT: stop taking items and cancel the tasks waiting for a seat."""
        self.stop.set()
        for task, phase in list(self.phase.items()):
            if phase == "round":
                task.cancel()

    async def run(self) -> None:
        """One task: take, run, settle, until stopped (or the queue is empty)."""
        me = asyncio.current_task()
        try:
            while not self.stop.is_set():
                self.phase[me] = "take"
                raw = await self.queue.take()
                if raw is None:
                    if self.args.exit_when_empty:
                        return
                    continue
                item = json.loads(raw)
                if self.stop.is_set():  # taken while stopping
                    await self.queue.give_back(raw, item)
                    return
                self.phase[me] = "round"
                try:
                    await self.one(raw, item)
                except asyncio.CancelledError:
                    # left round() (its wait or its call): the seat is released or the ticket
                    # withdrawn; the item goes back, shielded from a second cancellation
                    await asyncio.shield(self.queue.give_back(raw, item))
                    log.info("item %s: given back (cancelled in round() as the worker stops)", item["id"])
                    raise
        finally:
            self.phase.pop(me, None)

    async def one(self, raw: str, item: dict[str, Any]) -> None:
        attempt = int(item.get("attempt", 1))
        round_id = str(item["id"]) if attempt == 1 else f"{item['id']}#{attempt}"
        lane = item.get("lane") or self.args.lane
        started = time.monotonic()
        try:
            answer = await self.client.chat.completions.create(
                model=self.args.model, messages=[{"role": "user", "content": item.get("prompt", "")}],
                max_tokens=self.args.max_tokens, lane=lane, round_id=round_id)
        except openai.APIConnectionError as exc:
            if self.stop.is_set():  # the gate: seated after SIGTERM, never called
                await self.queue.give_back(raw, item)
                log.info("item %s lane %s: given back (seated as the worker stops: not called)", item["id"], lane)
            else:
                await self.failed(raw, item, lane, exc)
        except WaitTimeout:
            await self.queue.give_back(raw, item)
            log.info("item %s lane %s: no seat within %gs, given back", item["id"], lane, self.args.wait)
        except (openai.APIError, AdmissionError, redis.RedisError) as exc:
            await self.failed(raw, item, lane, exc)
        else:
            seconds = round(time.monotonic() - started, 3)
            usage = answer.usage
            result = {"id": item["id"], "lane": lane, "ok": True, "answer": answer.choices[0].message.content,
                      "tokens": usage.completion_tokens if usage else None, "seconds": seconds,
                      "round_id": round_id, "pod": self.pod}
            await self.queue.finish(raw, result)
            log.info("item %s lane %s: done in %.2fs (round %s, %s tokens)", item["id"], lane, seconds,
                     round_id, result["tokens"])

    async def failed(self, raw: str, item: dict[str, Any], lane: str, exc: BaseException) -> None:
        if self.stop.is_set():  # not the item's fault: it runs again on the next start
            await self.queue.give_back(raw, item)
            log.warning("item %s lane %s: failed while stopping (%s), given back", item["id"], lane, exc)
            return
        failures = int(item.get("failures", 0)) + 1
        if failures < self.args.attempts:
            await self.queue.give_back(raw, item, failed=True)
            log.warning("item %s lane %s: attempt failed (%s), queued again", item["id"], lane, exc)
            return
        await self.queue.finish(raw, {"id": item["id"], "lane": lane, "ok": False,
                                      "error": f"{type(exc).__name__}: {exc}", "failures": failures, "pod": self.pod})
        log.error("item %s lane %s: failed %d times, done as failed: %s", item["id"], lane, failures, exc)


async def serve(args: argparse.Namespace) -> int:
    url = os.environ.get("ADMISSION_URL", "redis://127.0.0.1:6379/0")
    mesh = os.environ.get("ADMISSION_MESH", "demo")
    pod = os.environ.get("ADMISSION_POD") or f"{socket.gethostname()}-{os.getpid()}"
    adm = AsyncAdmission.from_url(url, mesh=mesh, pod=pod)
    queue = Queue(aredis.Redis.from_url(url, socket_timeout=10), args.queue, pod)
    try:
        if not (await adm.policy())["version"]:  # fail now, not in every task
            log.error("cannot start: mesh %s has no policy (admission config apply ...)", mesh)
            return 1
        recovered = await queue.recover()
    except (AdmissionError, redis.RedisError) as exc:
        log.error("cannot start: %s", exc)
        return 1
    worker = Worker(args, adm, queue, pod)
    metrics = None if args.metrics_port is None else start_metrics_server(adm, args.metrics_port)
    loop = asyncio.get_running_loop()

    def on_signal(sig: signal.Signals) -> None:
        log.info("%s: finishing (grace %gs)", sig.name, args.grace)
        worker.stopping()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    log.info("worker %s on mesh %s, queue %s, pool %s, %d tasks%s", pod, mesh, args.queue, worker.pool,
             args.tasks, f" ({recovered} item(s) recovered)" if recovered else "")
    tasks = [asyncio.create_task(worker.run(), name=f"task-{i + 1}") for i in range(args.tasks)]
    try:
        pending = set(tasks)
        while pending and not worker.stop.is_set():
            _, pending = await asyncio.wait(pending, timeout=0.2)
        if pending:
            _, pending = await asyncio.wait(pending, timeout=args.grace)
        for task in pending:  # the grace is over: leave the calls too (round() releases the seats)
            task.cancel()
        crashed = [r for r in await asyncio.gather(*tasks, return_exceptions=True)
                   if isinstance(r, Exception)]  # a cancelled task is no crash
        for exc in crashed:
            log.error("a task failed: %r", exc)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await adm.close()
        await queue.client.aclose()
        if metrics is not None:
            metrics.stop()
    log.info("worker %s stopped", pod)
    return 1 if crashed else 0


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per item, not per request
    return asyncio.run(serve(args))


if __name__ == "__main__":
    sys.exit(main())
