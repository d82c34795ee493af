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


def show(level: int, stream: Any = None) -> None:
    """For the package's own tools (CLI, demo, bench, simulator): print the library's records at
    ``level`` and up on ``stream`` (stderr by default). A library user configures logging instead."""
    root = logging.getLogger("admission")
    for h in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:
        root.removeHandler(h)
    handler = logging.StreamHandler(stream)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(logging.Formatter("%(asctime)s [%(levelname)-7s] %(message)s", "%Y-%m-%d %H:%M:%S"))
    root.addHandler(handler)
    root.setLevel(level)
