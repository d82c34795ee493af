"""``admission serve``: the subcommand's arguments and its run (admission/cli.py adds it)."""
from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from .._log import get_logger
from ..errors import AdmissionError
from .metrics import MissingExtra
from .server import DEFAULT_HOST, DEFAULT_PORT, make_server, redact
from .source import one_line

log = get_logger("admission.serve")


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """The ``serve`` subcommand on ``sub`` (an argparse subparsers object), with all its arguments
    (--url, --mesh repeatable, --host, --port) and ``func=run_cli``: add no connection arguments."""
    p = sub.add_parser("serve", help="serve the census over HTTP: /metrics (Prometheus), /census.json, "
                                     "/healthz, /readyz and a live page at /")
    # SUPPRESS: the global --url/--mesh (and $ADMISSION_URL, $ADMISSION_MESH) apply unless given here
    p.add_argument("--url", default=argparse.SUPPRESS, help="Redis URL (default: the global --url)")
    p.add_argument("--mesh", dest="mesh", action="extend", nargs="+", default=argparse.SUPPRESS, metavar="MESH",
                   help="mesh(es) to serve, the first being the default of every endpoint (repeatable; default prod)")
    p.add_argument("--host", default=DEFAULT_HOST, help="address to listen on (default %(default)s)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="port to listen on (default %(default)s)")
    p.set_defaults(func=run_cli)
    return p


def run_cli(args: argparse.Namespace) -> int:
    """``admission serve``: 0 on Ctrl-C or SIGTERM; 2 with a one-line error (missing extra, bad
    mesh name, address in use). A Redis that does not answer yet is no error: /readyz says so."""
    mesh = getattr(args, "mesh", None) or ["prod"]
    meshes = [mesh] if isinstance(mesh, str) else list(mesh)  # the global --mesh is one name
    args.url = getattr(args, "url", None) or "redis://127.0.0.1:6379/0"
    try:
        server = make_server(args.url, meshes, args.host, args.port)
    except MissingExtra as exc:
        print(f"admission serve: {exc}", file=sys.stderr)
        return 2
    except AdmissionError as exc:
        print(f"admission serve: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    except (OSError, ValueError, OverflowError) as exc:
        print(f"admission serve: cannot listen on {args.host}:{args.port}: {one_line(exc)}", file=sys.stderr)
        return 2
    host, port = server.server_address[:2]
    shown = f"[{host}]" if ":" in str(host) else host
    print(f"admission serve: http://{shown}:{port}/ (meshes {', '.join(meshes)}; redis {redact(args.url)})",
          flush=True)
    log.info("serving", host=host, port=port, meshes=meshes, redis=redact(args.url))

    def stop(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, stop)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return 0
