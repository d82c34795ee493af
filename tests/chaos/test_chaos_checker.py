"""The checker's own rules, on made-up journals and samples (no server): what it must count as
an over-admission, and what the overdraft and re-assertions explain."""
from __future__ import annotations

from chaos.harness import Sample, analyze


def _sample(*seats: tuple[str, int], slots: int = 2) -> Sample:
    return Sample(0.0, [(rid, "ci", "m1@p1", "pod0", seq) for rid, seq in seats], [], {"m1@p1": slots})


def _admitted(rid: str, seq: int, reason: str) -> dict:
    return {"ev": "admitted", "id": rid, "seq": seq, "reason": reason}


def test_a_seat_beyond_the_slots_is_an_over_admission():
    events = [_admitted("a", 1, "within-floor"), _admitted("b", 2, "within-floor"), _admitted("c", 3, "borrowed")]
    f = analyze(events, [_sample(("a", 1), ("b", 2), ("c", 3))])
    assert f.over_admissions == 1 and "3 seats > 2 slots" in f.over_admission_detail[0]


def test_the_overdraft_and_reassertions_explain_seats_beyond_the_slots():
    events = [_admitted("a", 1, "within-floor"), _admitted("b", 2, "within-floor"), _admitted("c", 3, "overdraft"),
              _admitted("d", 4, "borrowed"), {"ev": "reasserted", "ids": ["d"]}]
    assert analyze(events, [_sample(("a", 1), ("b", 2), ("c", 3), ("d", 4))]).over_admissions == 0


def test_a_lost_admit_reply_keeps_the_servers_reason():
    # the pod heard only "same-intent" when it asked again; the server streamed "overdraft"
    events = [_admitted("a", 1, "within-floor"), _admitted("b", 2, "within-floor"), _admitted("c", 3, "same-intent")]
    samples = [_sample(("a", 1), ("b", 2), ("c", 3))]
    assert analyze(events, samples).over_admissions == 1
    assert analyze(events, samples, server_reasons={"c": "overdraft"}).over_admissions == 0
    assert analyze(events, samples, server_reasons={"c": "borrowed"}).over_admissions == 1


def test_one_round_under_two_seqs_is_seated_twice():
    events = [_admitted("a", 1, "within-floor"), _admitted("a", 2, "within-floor")]
    assert analyze(events, []).seated_twice == 1
