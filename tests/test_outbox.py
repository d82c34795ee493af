"""The local outbox (admission.outbox): order, durability, replay progress, dead letters, the size
bound, torn and corrupt frames, the single-opener lock, threads, and a SIGKILLed writer."""
from __future__ import annotations

import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

from admission.outbox import (HEADER_LEN, Outbox, OutboxError, OutboxFull, OutboxLocked, Retry,
                              dead_letters)


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "pod-1.outbox")


def fill(path, n, **kw):
    with Outbox(path, **kw) as ob:
        for i in range(n):
            ob.append({"i": i, "key": f"idem-{i}"})


def ids(ob):
    return [r.data["i"] for r in ob.pending()]


def events(caplog):
    return [r.admission["event"] for r in caplog.records if hasattr(r, "admission")]


def flip_byte(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


# ---------------------------------------------------------------- order and durability


def test_append_pending_and_replay_keep_the_append_order(path):
    with Outbox(path) as ob:
        assert len(ob) == 0 and ob.size_bytes == HEADER_LEN
        for i in range(10):
            ob.append({"i": i, "key": f"idem-{i}"})
        assert len(ob) == 10
        pending = ob.pending()
        assert [r.data for r in pending] == [{"i": i, "key": f"idem-{i}"} for i in range(10)]
        assert [r.offset for r in pending] == sorted(r.offset for r in pending)
        seen = []
        report = ob.replay(lambda d: seen.append(d["i"]))
        assert seen == list(range(10))
        assert (report.applied, report.kept, report.dead, report.error) == (10, 0, 0, None)
        # Everything applied: the file is emptied, not left to grow.
        assert len(ob) == 0 and ob.size_bytes == HEADER_LEN
    assert os.path.getsize(path) == HEADER_LEN


def test_records_survive_close_and_reopen_with_their_plain_values(path):
    record = {"key": "idem-é", "cost": 0.125, "tokens": 2**40, "neg": -3, "ok": True, "none": None,
              "list": [1, "two", [3.5]], "nested": {"a": {"b": []}}}
    with Outbox(path) as ob:
        ob.append(record)
        ob.append({"i": 2})
    with Outbox(path) as ob:
        assert [r.data for r in ob.pending()] == [record, {"i": 2}]
        ob.append({"i": 3})          # appends after a reopen land after the old records
    with Outbox(path) as ob:
        assert [r.data for r in ob.pending()] == [record, {"i": 2}, {"i": 3}]


@pytest.mark.parametrize("bad", [[1, 2], {"x": object()}, {"x": {1, 2}}, {"x": 2**70}])
def test_a_record_that_is_not_plain_values_is_refused_and_nothing_written(path, bad):
    with Outbox(path) as ob:
        with pytest.raises(TypeError):
            ob.append(bad)
        assert len(ob) == 0 and ob.size_bytes == HEADER_LEN
    assert os.path.getsize(path) == HEADER_LEN


# ---------------------------------------------------------------- replay progress


def test_a_transient_failure_keeps_that_record_and_the_rest_and_the_next_replay_resumes_there(path):
    fill(path, 6)
    calls = []

    def flaky(d):
        calls.append(d["i"])
        if d["i"] == 2 and calls.count(2) == 1:
            raise ConnectionError("redis down")     # transient by default

    with Outbox(path) as ob:
        report = ob.replay(flaky)
        assert (report.applied, report.kept, report.dead) == (2, 4, 0)
        assert isinstance(report.error, ConnectionError)
        assert ids(ob) == [2, 3, 4, 5]
        report = ob.replay(flaky)
        assert (report.applied, report.kept, report.dead) == (4, 0, 0)
    assert calls == [0, 1, 2, 2, 3, 4, 5]


def test_retry_stops_the_replay_and_progress_survives_a_reopen(path):
    fill(path, 10)
    calls = []

    def until_3(d):
        if d["i"] == 3:
            raise Retry("later")
        calls.append(d["i"])

    with Outbox(path) as ob:
        report = ob.replay(until_3)
        assert (report.applied, report.kept, report.dead) == (3, 7, 0)
        assert isinstance(report.error, Retry)
    with Outbox(path) as ob:
        assert ids(ob) == list(range(3, 10))
        ob.replay(lambda d: calls.append(d["i"]))
    assert calls == list(range(10))    # nothing applied twice, nothing skipped


def test_a_custom_transient_exception_stops_the_replay(path):
    class Busy(Exception):
        pass

    fill(path, 3)
    with Outbox(path) as ob:
        def busy(d):
            raise Busy

        report = ob.replay(busy, transient=(Busy,))
        assert (report.applied, report.kept, report.dead) == (0, 3, 0)
        assert dead_letters(path) == []


class Crash(BaseException):
    """Stands for the process dying: not an Exception, so nothing in the outbox may catch it."""


def test_a_crash_after_applying_a_record_but_before_marking_it_re_applies_only_that_record(path, monkeypatch):
    fill(path, 6)
    calls = []
    ob = Outbox(path)
    real_write_marker = ob._write_marker
    marks = []

    def crash_on_third(offset):
        marks.append(offset)
        if len(marks) == 3:
            raise Crash
        real_write_marker(offset)

    monkeypatch.setattr(ob, "_write_marker", crash_on_third)
    with pytest.raises(Crash):
        ob.replay(lambda d: calls.append(d["i"]))
    ob.close()                       # only releases the lock: it writes no progress
    assert calls == [0, 1, 2]        # record 2 was applied, its mark never written
    with Outbox(path) as ob:
        assert ids(ob) == [2, 3, 4, 5]
        ob.replay(lambda d: calls.append(d["i"]))
    assert calls == [0, 1, 2, 2, 3, 4, 5]


def test_a_crash_inside_apply_keeps_the_record(path):
    fill(path, 3)
    with Outbox(path) as ob:
        def die(d):
            raise Crash

        with pytest.raises(Crash):
            ob.replay(die)
        assert ids(ob) == [0, 1, 2]


def test_a_torn_progress_slot_falls_back_to_the_previous_one(path):
    fill(path, 10)
    with Outbox(path) as ob:
        ob.replay(lambda d: (_ for _ in ()).throw(Retry()) if d["i"] == 3 else None)
        assert ids(ob) == list(range(3, 10))
    # Marks 1, 2, 3 went to slots 1, 0, 1: damage the newest (slot 1, 32 bytes each).
    flip_byte(path + ".done", 32 + 20)
    with Outbox(path) as ob:
        assert ids(ob) == list(range(2, 10))   # one record re-applied, none skipped


# ---------------------------------------------------------------- dead letters


def test_a_non_transient_error_dead_letters_the_record_and_the_replay_goes_on(path, caplog):
    fill(path, 4)
    seen = []

    def apply(d):
        if d["i"] == 1:
            raise ValueError("unknown seat")
        seen.append(d["i"])

    with caplog.at_level(logging.WARNING, logger="admission"), Outbox(path) as ob:
        report = ob.replay(apply)
        assert (report.applied, report.kept, report.dead) == (3, 0, 1)
        assert len(ob) == 0
    assert seen == [0, 2, 3]
    [dead] = dead_letters(path)
    assert dead["kind"] == "error" and dead["record"] == {"i": 1, "key": "idem-1"}
    assert dead["error"] == "ValueError: unknown seat" and dead["outbox"] == path
    assert "outbox_dead_letter" in events(caplog)
    with Outbox(path) as ob:                 # dead-lettered means gone from the outbox
        assert len(ob) == 0


def test_a_record_damaged_on_disk_after_open_is_dead_lettered_at_replay(path, caplog):
    with Outbox(path) as ob:
        for i in range(3):
            ob.append({"i": i})
        offset = ob.pending()[1].offset
        flip_byte(path, offset + 5)          # another writer damages record 1 under us
        with caplog.at_level(logging.WARNING, logger="admission"):
            assert ids(ob) == [0, 2]
            seen = []
            report = ob.replay(lambda d: seen.append(d["i"]))
        assert (report.applied, report.dead, seen) == (2, 1, [0, 2])
    [dead] = dead_letters(path)
    assert dead["kind"] == "corrupt" and dead["offset"] == offset and isinstance(dead["raw"], bytes)


# ---------------------------------------------------------------- bound


def test_the_bound_raises_outbox_full_naming_the_file_and_bound_and_writes_nothing(path, caplog):
    bound = 200
    with Outbox(path, max_bytes=bound) as ob:
        n = 0
        with caplog.at_level(logging.WARNING, logger="admission"):
            with pytest.raises(OutboxFull) as info:
                while True:
                    ob.append({"i": n, "pad": "x" * 20})
                    n += 1
        assert n > 0
        message = str(info.value)
        assert path in message and str(bound) in message and str(ob.size_bytes) in message
        assert (info.value.path, info.value.bound) == (path, bound)
        size = ob.size_bytes
        assert size <= bound and os.path.getsize(path) == size and len(ob) == n
        assert "outbox_full" in events(caplog)
    with Outbox(path, max_bytes=bound) as ob:
        assert ids(ob) == list(range(n))


def test_applied_records_are_reclaimed_before_the_bound_refuses(path):
    bound = 400
    with Outbox(path, max_bytes=bound) as ob:
        n = 0
        try:
            while True:
                ob.append({"i": n, "pad": "x" * 20})
                n += 1
        except OutboxFull:
            pass
        # Apply fewer than half: the replay itself does not compact, the next append must.
        ob.replay(lambda d: (_ for _ in ()).throw(Retry()) if d["i"] == 2 else None)
        assert ob.size_bytes + 30 > bound
        ob.append({"i": n, "pad": "x" * 20})
        assert ids(ob) == list(range(2, n + 1))


# ---------------------------------------------------------------- torn and corrupt frames


@pytest.mark.parametrize("damage", ["mid_header", "mid_payload", "crc_of_last", "zero_tail"])
def test_a_torn_tail_is_truncated_at_open_with_a_warning(path, caplog, damage):
    fill(path, 4)
    with Outbox(path) as ob:
        last = ob.pending()[3].offset
    end = os.path.getsize(path)
    if damage == "mid_header":
        os.truncate(path, last + 2)
    elif damage == "mid_payload":
        os.truncate(path, last + 10)
    elif damage == "crc_of_last":
        flip_byte(path, end - 1)
    else:
        os.truncate(path, last)
        with open(path, "ab") as f:
            f.write(b"\0" * 100)
    with caplog.at_level(logging.WARNING, logger="admission"), Outbox(path) as ob:
        assert ids(ob) == [0, 1, 2]
        assert ob.size_bytes == last and os.path.getsize(path) == last
        ob.append({"i": 9})
    assert "outbox_torn_tail" in events(caplog)
    [dead] = dead_letters(path)              # the torn bytes are kept for an operator
    assert dead["kind"] == "torn_tail" and dead["offset"] == last
    with Outbox(path) as ob:
        assert ids(ob) == [0, 1, 2, 9]
    assert len(dead_letters(path)) == 1      # reported once, not at every open


def test_a_corrupt_middle_frame_is_dead_lettered_and_reading_continues(path, caplog):
    fill(path, 5)
    with Outbox(path) as ob:
        rec2 = ob.pending()[2].offset
    flip_byte(path, rec2 + 6)
    with caplog.at_level(logging.WARNING, logger="admission"), Outbox(path) as ob:
        assert ids(ob) == [0, 1, 3, 4]
    assert "outbox_corrupt" in events(caplog)
    [dead] = dead_letters(path)
    assert dead["kind"] == "corrupt" and dead["offset"] == rec2 and len(dead["raw"]) > 8
    with Outbox(path) as ob:                 # the bad frame left the file: no second report
        assert ids(ob) == [0, 1, 3, 4]
    assert len(dead_letters(path)) == 1


@pytest.mark.parametrize("length", [0xFFFFFFFF, "off_by_one"])
def test_a_corrupt_length_field_sends_the_rest_of_the_file_to_the_dead_letters_raw(path, length):
    fill(path, 5)
    with Outbox(path) as ob:
        rec2 = ob.pending()[2].offset
    with open(path, "r+b") as f:
        f.seek(rec2)
        old = int.from_bytes(f.read(4), "big")
        f.seek(rec2)
        f.write((old + 1 if length == "off_by_one" else length).to_bytes(4, "big"))
    end = os.path.getsize(path)
    with Outbox(path) as ob:
        assert ids(ob) == [0, 1]
        ob.append({"i": 7})
    [dead] = dead_letters(path)
    assert dead["kind"] == "corrupt" and dead["offset"] == rec2 and len(dead["raw"]) == end - rec2
    with Outbox(path) as ob:
        assert ids(ob) == [0, 1, 7]


def test_a_file_that_is_not_an_outbox_is_refused_and_left_alone(path):
    with open(path, "wb") as f:
        f.write(b"some other file, not ours")
    for _ in range(2):                       # the failed open released its lock
        with pytest.raises(OutboxError, match="not an outbox"):
            Outbox(path)
    with open(path, "rb") as f:
        assert f.read() == b"some other file, not ours"


def test_a_compaction_interrupted_before_its_rename_leaves_the_old_file_in_use(path):
    fill(path, 3)
    with open(path + ".compact", "wb") as f:
        f.write(b"half-written new generation")
    with Outbox(path) as ob:
        assert ids(ob) == [0, 1, 2]
    assert not os.path.exists(path + ".compact")


# ---------------------------------------------------------------- lock, threads, close


def test_a_second_outbox_on_the_same_path_is_refused_while_the_first_is_open(path):
    first = Outbox(path)
    with pytest.raises(OutboxLocked, match=str(os.getpid())) as info:
        Outbox(path)
    assert path in str(info.value)
    first.close()
    with Outbox(path) as again:
        assert len(again) == 0


def test_a_closed_outbox_refuses_work_and_close_is_idempotent(path):
    ob = Outbox(path)
    ob.close()
    ob.close()
    with pytest.raises(OutboxError, match="closed"):
        ob.append({"i": 1})
    with pytest.raises(OutboxError, match="closed"):
        ob.pending()


def test_records_appended_during_a_replay_are_replayed_too(path):
    with Outbox(path) as ob:
        for i in range(3):
            ob.append({"i": i})
        seen = []

        def apply(d):
            seen.append(d["i"])
            if d["i"] == 0:
                ob.append({"i": 100})        # apply runs without the outbox lock: no deadlock

        report = ob.replay(apply)
        assert seen == [0, 1, 2, 100] and report.applied == 4 and len(ob) == 0


def test_eight_threads_appending_concurrently_store_every_record_exactly_once(path):
    threads_n, per_thread = 8, 200
    errors = []
    with Outbox(path) as ob:
        start = threading.Barrier(threads_n)

        def worker(t):
            try:
                start.wait()
                for n in range(per_thread):
                    ob.append({"t": t, "n": n})
            except BaseException as exc:     # surfaced below: a thread's exception is silent
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(threads_n)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    assert errors == []
    with Outbox(path) as ob:
        records = [(r.data["t"], r.data["n"]) for r in ob.pending()]
    assert len(records) == len(set(records)) == threads_n * per_thread
    for t in range(threads_n):               # each thread's records keep its order
        assert [n for tt, n in records if tt == t] == list(range(per_thread))


# ---------------------------------------------------------------- SIGKILL


_WRITER = """
import sys
from admission.outbox import Outbox
ob = Outbox(sys.argv[1], max_bytes=1 << 30)
i = 0
while True:
    # Mostly large records, so that the kill often lands inside a write.
    size = (i * 7919) % 400_000 if i % 4 else 40
    ob.append({"i": i, "size": size, "pad": "x" * size})
    print(i, flush=True)
    i += 1
"""


@pytest.mark.parametrize("delay", [0.0, 0.03, 0.11])
def test_a_writer_killed_by_sigkill_leaves_only_whole_records_in_order(path, delay):
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, path], stdout=subprocess.PIPE, text=True)
    try:
        acked = -1
        while acked < 20:
            line = proc.stdout.readline()
            assert line, "the writer died on its own"
            acked = int(line)
        with pytest.raises(OutboxLocked, match=str(proc.pid)):   # another process holds it
            Outbox(path)
        time.sleep(delay + random.random() * 0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        rest = proc.stdout.read().split()
        acked = int(rest[-1]) if rest else acked
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    with Outbox(path) as ob:
        records = [r.data for r in ob.pending()]
    got = [d["i"] for d in records]
    # Every acknowledged record is there; at most the one being appended follows it.
    assert got == list(range(len(got))) and acked + 1 <= len(got) <= acked + 2
    assert all(d["pad"] == "x" * d["size"] for d in records)
    assert all(d["kind"] == "torn_tail" for d in dead_letters(path))
