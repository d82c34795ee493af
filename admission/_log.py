"""The library's loggers: structlog on top of stdlib ``logging``, whatever an application did with
structlog's global configuration (a CLI or a test that points structlog at a stream never takes
the library's records with it). Records go to the ``admission`` logger tree; the message reads
``event key=value ...`` and the fields ride on the record as ``record.admission`` (a dict) for
structured handlers."""
from __future__ import annotations

import logging
from typing import Any

import structlog


def _to_stdlib(_logger: Any, _method: str, event_dict: dict[str, Any]) -> tuple[tuple, dict]:
    event = str(event_dict.pop("event", ""))
    text = " ".join([event, *(f"{k}={v!r}" for k, v in event_dict.items())])
    return (text,), {"extra": {"admission": {"event": event, **event_dict}}}


def get_logger(name: str = "admission") -> structlog.stdlib.BoundLogger:
    return structlog.wrap_logger(logging.getLogger(name), processors=[_to_stdlib],
                                 wrapper_class=structlog.stdlib.BoundLogger)


_HANDLER_NAME = "admission-tools"


def _fields(_logger: Any, _method: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """A record of the library carries its event and fields on ``record.admission``: render those,
    not the flattened message."""
    extra = getattr(event_dict.get("_record"), "admission", None)
    if isinstance(extra, dict):
        event_dict.update(extra)
    return event_dict


def formatter(json_lines: bool) -> logging.Formatter:
    """structlog's stdlib formatter: one JSON object per record (a file, a pipe, a log shipper) or
    a console line (a terminal)."""
    renderer: Any = (structlog.processors.JSONRenderer() if json_lines
                     else structlog.dev.ConsoleRenderer(colors=False))
    return structlog.stdlib.ProcessorFormatter(
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        foreign_pre_chain=[structlog.stdlib.add_log_level, structlog.stdlib.add_logger_name,
                           structlog.processors.TimeStamper(fmt="iso", utc=True), _fields])


def show(level: int, stream: Any = None, json_lines: bool | None = None) -> None:
    """For the package's own tools (CLI, serve, demo, bench, simulator): print the library's records
    at ``level`` and up on ``stream`` (stderr by default): JSON lines when it is not a terminal, a
    console line when it is (``json_lines`` forces one). A library user configures logging instead:
    the library only ever logs through the ``admission`` logger tree, never to stdout."""
    import sys

    stream = stream if stream is not None else sys.stderr
    if json_lines is None:
        json_lines = not (hasattr(stream, "isatty") and stream.isatty())
    root = logging.getLogger("admission")
    for h in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:
        root.removeHandler(h)
    handler = logging.StreamHandler(stream)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(formatter(json_lines))
    root.addHandler(handler)
    root.setLevel(level)
