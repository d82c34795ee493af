"""The library logs through stdlib ``logging`` (structlog on top); the tools render its records as
JSON lines off a terminal and as console lines on one."""
from __future__ import annotations

import io
import json
import logging

from admission._log import get_logger, show


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _emit(stream) -> str:
    show(logging.INFO, stream)
    get_logger("admission.test").warning("round_moved", round="r1", pool="m@q")
    return stream.getvalue()


def test_logging_json_lines_off_a_terminal():
    line = _emit(io.StringIO()).strip().splitlines()[-1]
    doc = json.loads(line)
    assert (doc["event"], doc["round"], doc["pool"], doc["level"], doc["logger"]) == (
        "round_moved", "r1", "m@q", "warning", "admission.test")
    assert doc["timestamp"].endswith("Z")


def test_logging_a_console_line_on_a_terminal():
    text = _emit(Tty())
    assert "round_moved" in text and "round=r1" in text and not text.lstrip().startswith("{")


def test_logging_the_library_never_writes_to_stdout(capsys):
    root = logging.getLogger("admission")
    handlers, level = list(root.handlers), root.level
    for h in handlers:
        root.removeHandler(h)
    try:
        get_logger("admission").warning("something", x=1)
        out = capsys.readouterr()
        assert out.out == ""                 # stdout untouched: only logging's last resort (stderr)
    finally:
        for h in handlers:
            root.addHandler(h)
        root.setLevel(level)
