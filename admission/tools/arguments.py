"""What the tools' command lines share: a parser whose errors are one line, and number types."""
from __future__ import annotations

import argparse
import math


class UsageError(Exception):
    """A bad command line: the tool prints the one line and exits 2."""


class OneLineParser(argparse.ArgumentParser):
    """An argparse parser that raises UsageError instead of printing the usage text and exiting."""

    def error(self, message: str) -> None:  # type: ignore[override] - one line, not the usage text
        raise UsageError(message)


def positive_int(text: str) -> int:
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value
