"""The tools' tables: Markdown (for the docs) or aligned plain text."""
from __future__ import annotations

from typing import Collection, Sequence


def table(columns: Sequence[str], rows: Sequence[Sequence[str]], markdown: bool, right: Collection[int],
          rule: bool = True) -> list[str]:
    """The lines of a table: the columns in ``right`` right-aligned (``---:`` in Markdown), the
    others left-aligned; in plain text a line of dashes under the head when ``rule``."""
    if markdown:
        return (["| " + " | ".join(columns) + " |",
                 "|" + "|".join("---:" if i in right else "---" for i in range(len(columns))) + "|"]
                + ["| " + " | ".join(r) + " |" for r in rows])
    widths = [max(len(str(x)) for x in col) for col in zip(columns, *rows)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(str(c).rjust(w) if i in right else str(c).ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return [line(columns)] + ([line(["-" * w for w in widths])] if rule else []) + [line(r) for r in rows]
