"""The tools' progress bar (tqdm on stderr), or nothing."""
from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator

from tqdm import tqdm  # the `tools` extra


class NoBar:
    """Stands in for tqdm when there is no bar (a disabled tqdm still starts its monitor thread)."""

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str) -> None:
        pass


@contextlib.contextmanager
def progress_bar(total: int, progress: bool | None, unit: str = "call", desc: str = "bench") -> Iterator[Any]:
    """progress None: a bar when stderr is a terminal; True: always; False: never (the tools share it)."""
    if progress is False or (progress is None and not sys.stderr.isatty()):
        yield NoBar()
        return
    with tqdm(total=total, unit=unit, desc=desc, dynamic_ncols=True, leave=False) as bar:
        yield bar
