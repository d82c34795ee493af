"""A local, durable outbox for ledger entries that could not reach Redis.

When a release (with its cost) or a mid-round charge cannot be booked because Redis does not
answer, the client appends the record here and replays it once Redis answers again. The server
applies each record idempotently (every record carries its idempotency key), so the outbox only
has to guarantee that no record is lost and none is skipped; applying one twice is harmless.

Files, all beside ``path`` (one outbox per pod):

``path``        16-byte header (``MAGIC`` + an 8-byte random generation id), then frames:
                ``>I length`` | msgpack payload (a dict) | ``>I crc32(payload)``.
                Rewritten (never edited in place) by compaction, under a new generation id.
``path.done``   replay progress: two 32-byte slots written alternately (``ADON`` | generation |
                ``>Q`` seq | ``>Q`` end offset of the last applied frame | ``>I`` crc32). The
                valid slot of the current generation with the highest seq wins, so a torn slot
                write falls back to the previous slot (one record re-applied, never skipped).
``path.dead``   dead letters: the same frames, no header; each payload is a dict with ``kind``
                (``error`` | ``corrupt`` | ``torn_tail``), ``error``, ``outbox``, ``offset``,
                ``at`` and either ``record`` (the dict) or ``raw`` (bytes that could not be read).
``path.lock``   holds the ``flock`` (and the holder's pid): the lock is on a file that is never
                replaced, since compaction renames a new file over ``path``.
"""
from __future__ import annotations

import errno
import fcntl
import os
import struct
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack

from ._log import get_logger
from .errors import AdmissionError

log = get_logger("admission.outbox")

MAGIC = b"ADMOBX1\n"                 # format version lives in the magic
HEADER_LEN = len(MAGIC) + 8          # + generation id
FRAME_OVERHEAD = 8                   # length + crc
# A ledger entry is a few hundred bytes; a bigger length field is damage, not data.
MAX_RECORD_BYTES = 1 << 20

_U32 = struct.Struct(">I")
_MARK = struct.Struct(">4s8sQQ")     # magic, generation, seq, offset (+ crc32)
_MARK_MAGIC = b"ADON"
_SLOT = _MARK.size + 4

_fdatasync = getattr(os, "fdatasync", os.fsync)


class OutboxError(AdmissionError):
    """The outbox cannot be used: not an outbox file, closed, or an earlier fsync failed."""


class OutboxLocked(OutboxError):
    """Another process (or another Outbox object) has this outbox open."""


class OutboxFull(OutboxError):
    """Appending would pass the outbox's size bound; nothing was written."""

    def __init__(self, path: str, size: int, bound: int, needed: int) -> None:
        self.path, self.size, self.bound, self.needed = path, size, bound, needed
        super().__init__(f"outbox {path} is full: it holds {size} bytes and a {needed}-byte record "
                         f"would pass its bound of {bound} bytes; nothing was written")


class Retry(Exception):
    """Raised by a replay's ``apply``: keep this record, and every later one, for the next replay."""


class Unconfirmed(Retry):
    """The primary applied the record but fewer replicas than asked have it (``confirm_replicas``):
    a failover now could lose it, so it is kept and applied again (it counts once) until they do."""


@dataclass(frozen=True, slots=True)
class Record:
    offset: int            # frame offset in the current file (changes when the file is compacted)
    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ReplayReport:
    applied: int
    kept: int
    dead: int
    error: BaseException | None = None   # the Retry / transient error that stopped the replay


@dataclass(frozen=True, slots=True)
class _Unreadable:
    raw: bytes
    reason: str


# --------------------------------------------------------------------------
# Low-level helpers


def _frame(payload: bytes) -> bytes:
    return _U32.pack(len(payload)) + payload + _U32.pack(zlib.crc32(payload))


def _frame_at(buf: bytes | memoryview, pos: int, max_len: int) -> tuple[str, int]:
    """State of the frame at ``pos``: ("ok", end), ("crc", end), ("short", -1), ("length", -1)."""
    n = len(buf)
    if n - pos < FRAME_OVERHEAD:
        return "short", -1
    (ln,) = _U32.unpack_from(buf, pos)
    if not 1 <= ln <= max_len:       # msgpack never encodes a dict in 0 bytes
        return "length", -1
    end = pos + FRAME_OVERHEAD + ln
    if end > n:
        return "short", -1
    (crc,) = _U32.unpack_from(buf, end - 4)
    return ("ok" if zlib.crc32(buf[pos + 4:end - 4]) == crc else "crc"), end


@dataclass(frozen=True, slots=True)
class _Bad:
    offset: int
    raw: bytes
    kind: str              # "torn_tail" | "corrupt"
    reason: str


def _scan(buf: bytes, start: int, max_len: int) -> tuple[list[tuple[int, int]], list[_Bad], int | None, bool]:
    """Split ``buf[start:]`` into good frames (offset, length) and bad regions.

    Returns (frames, bad, cut, middle): ``cut`` is where the readable part ends when the rest of
    the file could not be framed (a torn tail, or damage with no plausible frame after it);
    ``middle`` tells that a bad frame was skipped between good ones."""
    view = memoryview(buf)
    frames: list[tuple[int, int]] = []
    bad: list[_Bad] = []
    n, pos, middle = len(buf), start, False
    while pos < n:
        state, end = _frame_at(view, pos, max_len)
        if state == "ok":
            frames.append((pos, end - pos))
            pos = end
            continue
        # A CRC mismatch followed by a good frame: the length field was right, only this frame
        # is damaged; skip it and keep reading. Anything less certain ends the readable part.
        if state == "crc" and end < n and _frame_at(view, end, max_len)[0] == "ok":
            bad.append(_Bad(pos, bytes(view[pos:end]), "corrupt", "CRC mismatch"))
            middle, pos = True, end
            continue
        if state == "short":
            kind, reason = "torn_tail", "partial frame at the end (interrupted append)"
        elif state == "crc" and end == n:
            kind, reason = "torn_tail", "CRC mismatch in the last frame (interrupted append)"
        elif state == "length" and buf.count(0, pos) == n - pos:
            kind, reason = "torn_tail", "zero-filled tail (interrupted append)"
        elif state == "length":
            kind, reason = "corrupt", f"implausible frame length {_U32.unpack_from(view, pos)[0]}; rest of the file"
        else:
            kind, reason = "corrupt", "CRC mismatch and no readable frame after it; rest of the file"
        bad.append(_Bad(pos, bytes(view[pos:]), kind, reason))
        return frames, bad, pos, middle
    return frames, bad, None, middle


def _pread_exact(fd: int, n: int, offset: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        b = os.pread(fd, n - got, offset + got)
        if not b:
            break
        chunks.append(b)
        got += len(b)
    return b"".join(chunks)


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        done = os.pwrite(fd, view, offset)
        view, offset = view[done:], offset + done


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _fsync_dir(path: str) -> None:
    # A new or renamed file is only durable once its directory entry is.
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _open_created(path: str, flags: int) -> tuple[int, bool]:
    try:
        return os.open(path, flags | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600), True
    except FileExistsError:
        return os.open(path, flags | os.O_CLOEXEC), False


def _decode(payload: bytes) -> dict[str, Any]:
    data = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    if not isinstance(data, dict):
        raise ValueError(f"payload is a {type(data).__name__}, not a dict")
    return data


def dead_letters(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The readable entries of the dead-letter file of the outbox at ``path`` (for operators and
    tests; safe to call while the outbox is open, the file is only ever appended to)."""
    try:
        with open(os.fspath(path) + ".dead", "rb") as f:
            buf = f.read()
    except FileNotFoundError:
        return []
    frames, _bad, _cut, _middle = _scan(buf, 0, len(buf))
    return [_decode(buf[o + 4:o + n - 4]) for o, n in frames]


# --------------------------------------------------------------------------


class Outbox:
    """An append-only, fsynced, bounded file of ledger records waiting for Redis.

    Thread-safe; one process per outbox (enforced with ``flock``). ``append`` returns only once
    the record is on disk; ``replay`` hands records to ``apply`` in order and durably records each
    one applied, so a crash re-applies at most the record in flight."""

    def __init__(self, path: str | os.PathLike[str], *, max_bytes: int = 64 * 2**20) -> None:
        if max_bytes < HEADER_LEN + FRAME_OVERHEAD + 1:
            raise ValueError(f"max_bytes={max_bytes} cannot hold a single record")
        self.path = os.fspath(path)
        self.max_bytes = max_bytes
        self.dead_path = self.path + ".dead"
        self._done_path = self.path + ".done"
        self._dir = os.path.dirname(os.path.abspath(self.path))
        self._lock = threading.Lock()          # file and index state
        self._sync_lock = threading.Lock()     # group commit; also held while the fd is swapped
        self._replay_lock = threading.Lock()   # one replay at a time
        self._closed = True
        self._fd: int | None = None
        self._done_fd: int | None = None
        self._dead_fd: int | None = None
        self._failed: OSError | None = None
        self._gen = b""
        self._size = 0
        self._synced = 0
        self._frames: list[tuple[int, int]] = []   # (offset, frame length) of every frame in the file
        self._ndone = 0                            # frames[:ndone] are applied (or dead-lettered)
        self._base = 0                             # ordinal of frames[0]; grows when compaction drops frames
        self._mark_seq = 0

        if not os.path.isdir(self._dir):
            os.makedirs(self._dir, exist_ok=True)
            _fsync_dir(os.path.dirname(self._dir))
        self._lock_fd = self._acquire_lock()
        self._closed = False
        try:
            self._load()
        except BaseException:
            self._close_fds()
            raise

    # ---- opening

    def _acquire_lock(self) -> int:
        lock_path = self.path + ".lock"
        fd, _ = _open_created(lock_path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _pread_exact(fd, 32, 0).decode(errors="replace").strip()
            os.close(fd)
            mine = " (this process: another Outbox object)" if holder == str(os.getpid()) else ""
            raise OutboxLocked(f"outbox {self.path} is already open elsewhere: {lock_path} is locked"
                               f" by pid {holder or '?'}{mine}; one process per outbox") from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        _pwrite_all(fd, f"{os.getpid()}\n".encode(), 0)
        return fd

    def _load(self) -> None:
        try:   # left by a compaction that crashed before its rename: the old file is still whole
            os.unlink(self.path + ".compact")
        except FileNotFoundError:
            pass
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            fd = None
        if fd is None or os.fstat(fd).st_size == 0:
            if fd is not None:
                os.close(fd)
            self._rewrite()
            return
        self._fd = fd
        size = os.fstat(fd).st_size
        buf = _pread_exact(fd, size, 0)
        if len(buf) < HEADER_LEN or not buf.startswith(MAGIC):
            raise OutboxError(f"{self.path} is not an outbox file (or another format version): "
                              f"header {buf[:len(MAGIC)]!r}, expected {MAGIC!r}")
        self._gen, self._size = buf[len(MAGIC):HEADER_LEN], len(buf)
        frames, bad, cut, middle = _scan(buf, HEADER_LEN, MAX_RECORD_BYTES)
        self._frames = frames
        done = self._read_marker()
        self._ndone = sum(1 for o, n in frames if o + n <= done)
        # Bytes that cannot be read are kept in the dead-letter file (fsynced) before they leave
        # the outbox: an operator may still recover a damaged record from them.
        for b in bad:
            self._dead_letter({"kind": b.kind, "error": b.reason, "offset": b.offset, "raw": b.raw})
            log.warning("outbox_torn_tail" if b.kind == "torn_tail" else "outbox_corrupt",
                        path=self.path, offset=b.offset, bytes=len(b.raw), reason=b.reason,
                        dead_letter=self.dead_path)
        if middle or self._ndone:
            self._compact()      # drops applied and corrupt frames (and any cut tail) at once
        elif cut is not None:
            os.ftruncate(fd, cut)
            os.fsync(fd)
            self._size = cut
        self._synced = self._size

    # ---- progress marker

    def _read_marker(self) -> int:
        try:
            with open(self._done_path, "rb") as f:
                data = f.read(2 * _SLOT)
        except FileNotFoundError:
            return HEADER_LEN
        best: tuple[int, int] | None = None
        readable = False
        for i in range(2):
            slot = data[i * _SLOT:(i + 1) * _SLOT]
            if len(slot) < _SLOT or zlib.crc32(slot[:-4]) != _U32.unpack_from(slot, _SLOT - 4)[0]:
                continue
            magic, gen, seq, offset = _MARK.unpack_from(slot)
            if magic != _MARK_MAGIC:
                continue
            readable = True
            self._mark_seq = max(self._mark_seq, seq)
            # Slots of an older generation describe a file that compaction replaced: ignore them.
            if gen == self._gen and (best is None or seq > best[0]):
                best = (seq, offset)
        if data and not readable:
            log.warning("outbox_done_marker_unreadable", path=self._done_path,
                        consequence="pending records are replayed again (idempotent)")
        return best[1] if best else HEADER_LEN

    def _write_marker(self, offset: int) -> None:
        if self._done_fd is None:
            self._done_fd, created = _open_created(self._done_path, os.O_RDWR)
            if created:
                _fsync_dir(self._dir)
        seq = self._mark_seq + 1
        slot = _MARK.pack(_MARK_MAGIC, self._gen, seq, offset)
        # Alternate slots: a torn write can only damage the slot being written.
        _pwrite_all(self._done_fd, slot + _U32.pack(zlib.crc32(slot)), (seq % 2) * _SLOT)
        _fdatasync(self._done_fd)
        self._mark_seq = seq

    def _mark_done(self, ordinal: int) -> None:
        # Replay marks frames strictly in order; compaction only drops frames already marked.
        assert ordinal == self._base + self._ndone, (ordinal, self._base, self._ndone)
        off, n = self._frames[self._ndone]
        self._write_marker(off + n)
        self._ndone += 1

    # ---- dead letters

    def _dead_letter(self, entry: dict[str, Any]) -> None:
        entry = {"outbox": self.path, "at": time.time(), **entry}
        if self._dead_fd is None:
            fd, created = _open_created(self.dead_path, os.O_RDWR)
            try:
                if created:
                    _fsync_dir(self._dir)
                else:
                    self._trim_dead_tail(fd)
            except BaseException:
                os.close(fd)
                raise
            self._dead_fd = fd
        end = os.fstat(self._dead_fd).st_size
        _pwrite_all(self._dead_fd, _frame(msgpack.packb(entry, use_bin_type=True)), end)
        _fdatasync(self._dead_fd)

    def _trim_dead_tail(self, fd: int) -> None:
        # An append torn by a crash would hide every later entry from readers: cut it first.
        buf = _pread_exact(fd, os.fstat(fd).st_size, 0)
        _frames, _bad, cut, _middle = _scan(buf, 0, len(buf))
        if cut is not None:
            log.warning("outbox_dead_letter_torn_tail", path=self.dead_path, offset=cut,
                        bytes=len(buf) - cut)
            os.ftruncate(fd, cut)
            os.fsync(fd)

    # ---- compaction

    def _rewrite(self) -> None:
        """Write a new generation holding the pending frames and rename it over the outbox; a
        crash leaves either the old file or the new one, both consistent with the progress marker
        (whose slots name their generation)."""
        keep = self._frames[self._ndone:]
        gen = os.urandom(8)
        while gen == self._gen:
            gen = os.urandom(8)
        tmp = self.path + ".compact"
        out = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            _write_all(out, MAGIC + gen)
            new, pos = [], HEADER_LEN
            for off, n in keep:
                new.append((pos, n))
                pos += n
            # Copy contiguous runs in chunks rather than frame by frame.
            runs: list[list[int]] = []
            for off, n in keep:
                if runs and runs[-1][0] + runs[-1][1] == off:
                    runs[-1][1] += n
                else:
                    runs.append([off, n])
            for off, n in runs:
                for chunk_off in range(off, off + n, 1 << 20):
                    chunk = _pread_exact(self._fd, min(1 << 20, off + n - chunk_off), chunk_off)
                    _write_all(out, chunk)
            os.fsync(out)
            os.replace(tmp, self.path)
        except BaseException:
            os.close(out)
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        # The rename is done: switch to the new file before anything else can fail.
        old, self._fd, self._gen, self._size = self._fd, out, gen, pos
        self._frames, self._base, self._ndone = new, self._base + self._ndone, 0
        self._synced = pos
        if old is not None:
            os.close(old)
        _fsync_dir(self._dir)

    def _compact(self) -> None:
        with self._sync_lock:    # appenders waiting to fsync must not see the fd swap half-done
            self._rewrite()

    # ---- public API

    def append(self, record: dict[str, Any]) -> None:
        """Write ``record`` and fsync it; returns once it is durable. Raises OutboxFull (nothing
        written) when the bound would be passed, TypeError for a record msgpack cannot encode."""
        if not isinstance(record, dict):
            raise TypeError(f"an outbox record is a dict, not {type(record).__name__}")
        try:
            payload = msgpack.packb(record, use_bin_type=True)
        except (TypeError, ValueError, OverflowError) as exc:
            raise TypeError(f"outbox record is not made of plain values: {exc}") from exc
        if len(payload) > MAX_RECORD_BYTES:
            raise ValueError(f"outbox record of {len(payload)} bytes exceeds {MAX_RECORD_BYTES} bytes")
        frame = _frame(payload)
        with self._lock:
            self._check_usable()
            if self._size + len(frame) > self.max_bytes and self._ndone:
                self._compact()  # applied records still take room: reclaim it first
            if self._size + len(frame) > self.max_bytes:
                log.warning("outbox_full", path=self.path, size=self._size, bound=self.max_bytes,
                            record_bytes=len(frame), pending=len(self._frames) - self._ndone)
                raise OutboxFull(self.path, self._size, self.max_bytes, len(frame))
            start = self._size
            try:
                _pwrite_all(self._fd, frame, start)
            except BaseException:
                # A partial frame (disk full...) must not stay where the next append writes.
                try:
                    os.ftruncate(self._fd, start)
                except OSError:
                    pass
                raise
            self._size = start + len(frame)
            self._frames.append((start, len(frame)))
            gen, end = self._gen, self._size
        self._sync(gen, end)

    def _sync(self, gen: bytes, end: int) -> None:
        # Group commit: one fdatasync covers every frame written before it started, so threads
        # appending together share fsyncs instead of queueing one each behind the file lock.
        with self._sync_lock:
            if self._gen != gen or self._synced >= end:
                return           # a compaction (which fsyncs) or another thread's fsync covered it
            if self._closed:
                raise OutboxError(f"outbox {self.path} was closed before the record was fsynced")
            if self._failed is not None:
                raise OutboxError(f"outbox {self.path}: an earlier fsync failed") from self._failed
            target = self._size
            try:
                _fdatasync(self._fd)
            except OSError as exc:
                # After a failed fsync the kernel may have dropped dirty pages: a retry could
                # "succeed" without the data. Refuse every later append instead of lying.
                self._failed = exc
                log.error("outbox_fsync_failed", path=self.path, error=repr(exc))
                raise
            self._synced = target

    def pending(self) -> list[Record]:
        """The records not applied yet, in append order."""
        with self._lock:
            self._check_open()
            out = []
            for off, n in self._frames[self._ndone:]:
                item = self._read(off, n)
                if isinstance(item, _Unreadable):  # the next replay dead-letters it
                    log.warning("outbox_unreadable_record", path=self.path, offset=off, reason=item.reason)
                    continue
                out.append(Record(off, item))
            return out

    def _read(self, off: int, n: int) -> dict[str, Any] | _Unreadable:
        raw = _pread_exact(self._fd, n, off)
        state, end = _frame_at(raw, 0, MAX_RECORD_BYTES)
        if state != "ok" or end != n:
            return _Unreadable(raw, f"frame changed on disk since open ({state})")
        try:
            return _decode(raw[4:-4])
        except Exception as exc:  # msgpack raises several types for bad input
            return _Unreadable(raw, f"undecodable payload: {exc!r}")

    def replay(self, apply: Callable[[dict[str, Any]], Any], *,
               transient: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError)) -> ReplayReport:
        """Hand each pending record to ``apply`` in order.

        ``apply`` returns: applied (or already applied), marked done durably. It raises Retry or
        one of ``transient``: the replay stops, that record and the rest are kept. Any other
        Exception: the record goes to the dead-letter file with the error, and replay goes on.
        A BaseException (KeyboardInterrupt...) propagates with the record kept: whether it was
        applied is unknown, and re-applying is safe. ``apply`` runs without the outbox lock, so
        appends are not blocked by a slow replay; records appended meanwhile are replayed too."""
        applied = dead = 0
        stop: BaseException | None = None
        with self._replay_lock:
            while True:
                with self._lock:
                    self._check_open()
                    if self._ndone >= len(self._frames):
                        break
                    ordinal = self._base + self._ndone
                    off, n = self._frames[self._ndone]
                    item = self._read(off, n)
                    if isinstance(item, _Unreadable):
                        self._dead_letter({"kind": "corrupt", "error": item.reason, "offset": off, "raw": item.raw})
                        self._mark_done(ordinal)
                        log.warning("outbox_corrupt", path=self.path, offset=off, reason=item.reason,
                                    dead_letter=self.dead_path)
                        dead += 1
                        continue
                try:
                    apply(item)
                except Retry as exc:
                    stop = exc
                    break
                except transient as exc:
                    stop = exc
                    break
                except Exception as exc:
                    error = f"{type(exc).__name__}: {exc}"
                    with self._lock:
                        self._check_open()
                        self._dead_letter({"kind": "error", "error": error, "offset": off, "record": item})
                        self._mark_done(ordinal)
                    log.warning("outbox_dead_letter", path=self.path, offset=off, error=error,
                                dead_letter=self.dead_path)
                    dead += 1
                    continue
                with self._lock:
                    self._check_open()
                    self._mark_done(ordinal)
                applied += 1
            with self._lock:
                kept = len(self._frames) - self._ndone
                done_bytes = (self._frames[self._ndone - 1][0] + self._frames[self._ndone - 1][1]
                              - HEADER_LEN) if self._ndone else 0
                # Empty the file once everything is applied; otherwise reclaim the applied prefix
                # only when it is at least half the file, to bound the copying.
                if not self._closed and self._ndone and (kept == 0 or 2 * done_bytes >= self._size):
                    try:
                        self._compact()
                    except OSError as exc:   # progress is already durable in the marker
                        log.warning("outbox_compaction_failed", path=self.path, error=repr(exc))
        return ReplayReport(applied=applied, kept=kept, dead=dead, error=stop)

    def __len__(self) -> int:
        with self._lock:
            self._check_open()
            return len(self._frames) - self._ndone

    @property
    def size_bytes(self) -> int:
        """Bytes of the outbox file (header, pending records, applied ones not compacted yet)."""
        with self._lock:
            return self._size

    def _check_open(self) -> None:
        if self._closed:
            raise OutboxError(f"outbox {self.path} is closed")

    def _check_usable(self) -> None:
        self._check_open()
        if self._failed is not None:
            raise OutboxError(f"outbox {self.path}: an earlier fsync failed; reopen it "
                              f"(records fsynced before are safe)") from self._failed

    # ---- closing

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            with self._sync_lock:
                # An appender between its write and its fsync is covered by this one.
                if self._fd is not None and self._failed is None and self._synced < self._size:
                    try:
                        _fdatasync(self._fd)
                        self._synced = self._size
                    except OSError as exc:
                        self._failed = exc
                        log.error("outbox_fsync_failed", path=self.path, error=repr(exc))
                self._close_fds()

    def _close_fds(self) -> None:
        self._closed = True
        for name in ("_fd", "_done_fd", "_dead_fd"):
            fd = getattr(self, name)
            if fd is not None:
                setattr(self, name, None)
                try:
                    os.close(fd)
                except OSError as exc:
                    if exc.errno != errno.EBADF:
                        raise
        fd, self._lock_fd = getattr(self, "_lock_fd", None), None
        if fd is not None:
            os.close(fd)     # last: releases the flock

    def __enter__(self) -> Outbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # An Outbox dropped without close() must not keep its flock until the process exits.
        if not getattr(self, "_closed", True):
            try:
                self.close()
            except Exception:
                pass

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._frames) - self._ndone} pending, {self._size} bytes"
        return f"Outbox({self.path!r}, {state})"
