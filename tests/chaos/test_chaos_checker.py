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


# -- the report's tables: where --write puts them (docs/reliability.md; the README holds none) ----------

def test_the_report_writes_both_tables_into_the_reliability_page(tmp_path):
    from chaos import report

    page = report.PAGE.read_text()
    assert page.index(report.HEADLINE_START) < page.index(report.HEADLINE_END) < page.index(report.START) \
        < page.index(report.END)
    copy = tmp_path / "reliability.md"
    copy.write_text(page)
    report.write(copy, "FIGURES\n", "HEADLINE\n")
    out = copy.read_text()
    assert f"{report.HEADLINE_START}\nHEADLINE\n{report.HEADLINE_END}" in out
    assert f"{report.START}\nFIGURES\n{report.END}" in out
    before, after = page.split(report.HEADLINE_START)[0], page.split(report.END)[1]
    assert out.startswith(before) and out.endswith(after)   # nothing else of the page changes


def test_the_report_refuses_a_page_without_its_markers(tmp_path):
    import pytest

    from chaos import report

    copy = tmp_path / "reliability.md"
    copy.write_text(f"# no headline here\n{report.START}\nold\n{report.END}\n")
    with pytest.raises(SystemExit, match="chaos-headline"):
        report.write(copy, "FIGURES\n", "HEADLINE\n")


def test_the_headline_sums_what_must_be_zero_and_keeps_the_heal_time():
    from chaos import report

    rows = [{"section": "pods", "name": "pods: over-admission events", "value": 0, "unit": "", "must": "0",
             "settings": {}, "at": 1},
            {"section": "clock", "name": "over-admission events (stepped)", "value": 0, "unit": "", "must": "0",
             "settings": {}, "at": 1},
            {"section": "pods", "name": "heal time after SIGKILL, p50", "value": 1.8, "unit": "s", "must": "",
             "settings": {"lease_ttl_s": 1.5}, "at": 1}]
    text = report.headline(rows)
    assert "| over-admission events | 0 | clock, pods |" in text
    assert "| heal time after SIGKILL, p50 | 1.8 s | lease_ttl 1.5 s |" in text
