"""Where a tool's logs go while it runs: stderr, at a level (stdout carries its table)."""
from __future__ import annotations

import contextlib
import logging
import sys
from typing import Iterator

import structlog

from .._log import show


def logs_to_stderr(level: int, library: bool = True) -> None:
    """structlog at ``level`` and up on stderr; ``library``: the library's own records too
    (the ``admission`` logger tree, admission._log.show)."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(level),
                        logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    if library:
        show(level, sys.stderr)


@contextlib.contextmanager
def quiet_logs(level: int = logging.WARNING, library: bool = True) -> Iterator[None]:
    """logs_to_stderr while the block runs, then structlog's configuration as it was."""
    old = structlog.get_config()
    logs_to_stderr(level, library)
    try:
        yield
    finally:
        structlog.configure(**old)
