"""The census of each mesh served, read from Redis and kept for ``cache_seconds``: every endpoint
(the metrics, the JSON, the page) reads it here, so a burst of scrapes and page polls costs one
rebuild, and a dead Redis is asked once per ``cache_seconds``, not once per request."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import redis

from .._log import get_logger
from ..mesh import Mesh
from ..core import UNREACHABLE, mesh_key
from ..errors import AdmissionError, NoPolicy, Unavailable

log = get_logger("admission.serve")

CACHE_SECONDS = 1.0


@dataclass(frozen=True)
class Snapshot:
    """One read of a mesh: the census and the cumulative totals, or why they could not be read."""
    mesh: str
    fetched: float  # monotonic time of the read
    census: dict[str, Any] | None = None
    totals: dict[str, int] | None = None
    error: str | None = None  # one line: Redis unreachable, no policy, ...


def totals_key(mesh: str) -> str:
    return mesh_key(mesh, "totals")


class CensusSource:
    """The meshes served and their last reads, each kept ``cache_seconds`` (a failure too)."""

    def __init__(self, client: redis.Redis, meshes: Iterable[str], *, cache_seconds: float = CACHE_SECONDS,
                 clock: Callable[[], float] = time.monotonic):
        self.meshes = list(dict.fromkeys(meshes))
        if not self.meshes:
            raise ValueError("serve at least one mesh")
        self.redis = client
        # a Mesh validates each mesh name (BadName); it holds no clock and no outbox: reads only
        self.adms = {m: Mesh(client, mesh=m) for m in self.meshes}
        self.cache_seconds = cache_seconds
        self.clock = clock
        self._locks = {m: threading.Lock() for m in self.meshes}
        self._cache: dict[str, Snapshot] = {}
        self._failing: dict[str, str | None] = {}

    def snapshot(self, mesh: str) -> Snapshot:
        """The mesh's census and totals, read at most once per ``cache_seconds`` (single flight:
        concurrent requests wait for one read)."""
        with self._locks[mesh]:
            hit = self._cache.get(mesh)
            if hit is not None and self.clock() - hit.fetched < self.cache_seconds:
                return hit
            snap = self._read(mesh)
            self._cache[mesh] = snap
            self._note(mesh, snap.error)
            return snap

    def _read(self, mesh: str) -> Snapshot:
        adm = self.adms[mesh]
        try:
            census = adm.census()
            raw = self.redis.hgetall(totals_key(mesh))
        except NoPolicy:
            return Snapshot(mesh, self.clock(), error=f"no policy applied to mesh {mesh}")
        except (Unavailable, *UNREACHABLE) as exc:
            return Snapshot(mesh, self.clock(), error=f"redis unreachable: {one_line(exc)}")
        except (AdmissionError, redis.RedisError) as exc:
            return Snapshot(mesh, self.clock(), error=f"census failed: {type(exc).__name__}: {one_line(exc)}")
        return Snapshot(mesh, self.clock(), census=census, totals=_decode_totals(raw))

    def _note(self, mesh: str, error: str | None) -> None:
        """Log a mesh's read going bad or recovering once, not on every scrape."""
        before = self._failing.get(mesh)
        if error and error != before:
            log.warning("census_unavailable", mesh=mesh, error=error)
        elif before and not error:
            log.info("census_recovered", mesh=mesh)
        self._failing[mesh] = error

    def ready(self, mesh: str) -> tuple[bool, str]:
        """Redis answers and the mesh has a policy (read now, never cached)."""
        try:
            version = self.redis.hget(self.adms[mesh].calls.config_key, "version")
        except UNREACHABLE as exc:
            return False, f"redis unreachable: {one_line(exc)}"
        except redis.RedisError as exc:
            return False, f"redis error: {one_line(exc)}"
        if not version:
            return False, f"no policy applied to mesh {mesh}"
        return True, f"ready: mesh {mesh} policy v{int(version)}"


def one_line(exc: BaseException) -> str:
    """An exception as one line of text (its message with the white space folded)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def number(x: Any) -> float:
    """A census field as a number: true is 1, a missing or unreadable one 0."""
    if isinstance(x, bool):
        return 1.0 if x else 0.0
    try:
        return float(x)
    except (TypeError, ValueError):
        return 0.0


def _text(x: Any) -> str:
    return x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x)


def _decode_totals(raw: dict[Any, Any]) -> dict[str, int]:
    out = {}
    for k, v in raw.items():
        try:
            out[_text(k)] = int(_text(v))
        except ValueError:
            log.debug("totals_field_skipped", field=_text(k), value=_text(v))
    return out
