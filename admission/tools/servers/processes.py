"""Process hygiene: every server started is stopped at interpreter exit, and dies with its parent."""
from __future__ import annotations

import atexit
import ctypes
import os
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .server import LocalServer


_live: set["LocalServer"] = set()
_live_lock = threading.Lock()


@atexit.register
def _stop_all() -> None:
    with _live_lock:
        servers = list(_live)
    for srv in servers:
        srv.stop()


def _pdeathsig_hook():
    """A preexec_fn making the child get SIGTERM when its parent dies, even if
    the parent is SIGKILLed and atexit never runs. None off Linux."""
    if sys.platform != "linux":
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)  # loaded here, not post-fork
    except OSError:
        return None
    parent = os.getpid()

    def hook() -> None:
        libc.prctl(1, signal.SIGTERM)  # 1 == PR_SET_PDEATHSIG
        if os.getppid() != parent:  # parent already gone before prctl
            os._exit(1)

    return hook


def _log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "<no log>"


class ServerStartError(RuntimeError):
    """A local server did not come up; the message carries its log tail."""
