"""``admission fake-provider`` (also ``python -m admission.tools.fake_provider``): the command line."""
from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from datetime import datetime, timezone
from typing import Sequence

from ..arguments import OneLineParser, UsageError, positive_float
from ..sim import ceilings
from .server import FakeProviderServer
from .statuses import FAULT_STATUSES

DEFAULT_PORT = 8400
DESCRIPTION = sys.modules[__package__].__doc__.split("\n\n")[0]


def _pair(text: str, what: str) -> tuple[str, float]:
    name, sep, value = text.partition("=")
    try:
        if not sep or not name:
            raise ValueError
        return name, float(value)
    except ValueError:
        raise UsageError(f"{what} must be NAME=NUMBER, got {text!r}") from None


def _unix_time(text: str) -> float:
    """Unix seconds, or an ISO 8601 time (UTC without a zone)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        at = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected Unix seconds or an ISO 8601 time, got {text!r}") from None
    return (at if at.tzinfo else at.replace(tzinfo=timezone.utc)).timestamp()


def _ceiling_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("rate ceilings (per API key and model; none: no ceiling, no rate-limit headers)")
    for kind in ceilings.KINDS:
        words, abbrev, _, _ = ceilings.NAMES[kind]
        g.add_argument(f"--{kind}", type=positive_float, default=None, metavar="N",
                       help=f"{words.replace('min', 'minute')} ({abbrev})")
    g.add_argument("--style", choices=ceilings.STYLES, default="openai",
                   help="how tokens are counted and which headers are sent (default openai)")
    g.add_argument("--outside-tpm", type=float, default=0.0, metavar="N",
                   help="tokens per minute spent on the key from outside the mesh (tpm, itpm, tpd)")
    g.add_argument("--outside-rpm", type=float, default=0.0, metavar="N",
                   help="requests per minute spent on the key from outside the mesh (rpm, rpd)")
    g.add_argument("--rpm-burst-s", type=positive_float, default=ceilings.MINUTE, metavar="S",
                   help="the request bucket holds S seconds of its rate (default 60: the limit; "
                        "1: 60 RPM as one request a second)")
    g.add_argument("--cache-read-share", type=float, default=0.0, metavar="P",
                   help="share of the input read from the cache (not counted against ITPM)")
    g.add_argument("--cache-write-share", type=float, default=0.0, metavar="P",
                   help="share of the input written to the cache (counted against ITPM)")
    g.add_argument("--clock-start", type=_unix_time, default=None, metavar="TIME",
                   help="the provider's clock at start (Unix seconds or ISO 8601; default now): its UTC days")


def _arguments() -> argparse.ArgumentParser:
    p = OneLineParser(prog="admission fake-provider", description=DESCRIPTION)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="0: any free port (printed)")
    p.add_argument("--capacity", type=float, default=12.0, help="K of a model without --model (default 12)")
    p.add_argument("--model", action="append", default=[], metavar="NAME=K", help="a model's capacity (repeatable)")
    p.add_argument("--scale", type=float, default=1.0, help="simulated seconds per real second")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--tokens", type=int, default=600, help="completion tokens when a request names none")
    p.add_argument("--price-per-1k", type=float, default=0.01, help="USD per 1,000 tokens")
    p.add_argument("--key-limit-usd", type=float, default=None, help="daily limit of every API key")
    p.add_argument("--fault", action="append", default=[], metavar="STATUS=P",
                   help=f"inject STATUS (one of {', '.join(map(str, FAULT_STATUSES))}) with probability P")
    p.add_argument("--overloaded-share", type=float, default=0.0, help="share of the 429s sent as 529")
    p.add_argument("--retry-after-max", type=float, default=60.0, help="cap of retry-after, real s")
    _ceiling_arguments(p)
    return p


def server_from_args(args: argparse.Namespace) -> FakeProviderServer:
    """The server the arguments describe; UsageError/ValueError with one line when they are bad."""
    models = dict(_pair(m, "--model") for m in args.model)
    faults = {status: p for status, p in (_pair(f, "--fault") for f in args.fault)}
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be within 0..65535, got {args.port}")
    return FakeProviderServer(capacity=args.capacity, models=models, scale=args.scale, seed=args.seed,
                              tokens=args.tokens, price_per_1k=args.price_per_1k, key_limit_usd=args.key_limit_usd,
                              faults=faults, overloaded_share=args.overloaded_share,
                              retry_after_max=args.retry_after_max, host=args.host, port=args.port,
                              ceilings={kind: getattr(args, kind) for kind in ceilings.KINDS}, style=args.style,
                              outside={"tpm": args.outside_tpm, "rpm": args.outside_rpm},
                              rpm_burst_s=args.rpm_burst_s, cache_read_share=args.cache_read_share,
                              cache_write_share=args.cache_write_share, clock_start=args.clock_start)


async def _serve_until_signal(srv: FakeProviderServer) -> None:
    url = await srv.open()
    print(f"fake provider on {url} (OpenAI: {url}/v1, Anthropic: {url})", flush=True)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda: asyncio.ensure_future(srv.aclose()))
    await srv.serve_forever()


def main(argv: Sequence[str] | None = None) -> int:
    try:
        srv = server_from_args(_arguments().parse_args(argv))
    except (UsageError, ValueError) as exc:
        print(f"admission fake-provider: {exc}", file=sys.stderr)
        return 2
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(_serve_until_signal(srv))
    except OSError as exc:  # the port is taken, the host cannot be bound
        print(f"admission fake-provider: cannot serve on {srv.host}:{srv.port}: {exc.strerror or exc}",
              file=sys.stderr)
        return 1
    return 0
