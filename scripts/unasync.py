"""Generate the sync modules from their asyncio source, by substitution (httpcore's way).

    python scripts/unasync.py           # write the sync modules
    python scripts/unasync.py --check   # exit 1 when one is stale (tests/test_unasync.py runs it)

The asyncio code is the source; the few real differences between the flavours are the
primitives of ``admission/_primitives.py`` (``AsyncX`` / ``X``, ``aname`` / ``name``), so a
textual rewrite gives the sync code. Every substitution must be used at least once, so a
stale rule shows.
"""
from __future__ import annotations

import io
import re
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: (asyncio source, generated sync module), relative to the repository.
FILES = [
    ("admission/aio.py", "admission/client.py"),
    ("admission/_scripts_async.py", "admission/_scripts_sync.py"),
    ("admission/_mesh_async.py", "admission/mesh.py"),
    ("admission/integrations/_streams_async.py", "admission/integrations/_streams_sync.py"),
    ("admission/integrations/_calls_async.py", "admission/integrations/_calls_sync.py"),
    ("admission/integrations/_httpx_async.py", "admission/integrations/_httpx_sync.py"),
]

#: (regex, replacement), applied in this order, as whole words.
SUBS = [
    (r"^import redis\.asyncio as aredis\n", ""),  # the sync flavour has `import redis` already
    (r"^.*  # asyncio only\n", ""),  # a line the sync flavour has no use for (an alias)
    (r"aredis\.Redis", "redis.Redis"),
    (r"AsyncIterator", "Iterator"),
    (r"Async([A-Z][A-Za-z0-9_]*)", r"\1"),
    (r"async def", "def"),
    (r"async with", "with"),
    (r"await ", ""),
    (r"asynccontextmanager", "contextmanager"),
    (r"__aenter__", "__enter__"),
    (r"__aexit__", "__exit__"),
    (r"async for", "for"),
    (r"__aiter__", "__iter__"),
    (r"__anext__", "__next__"),
    (r"anext", "next"),
    (r"StopAsyncIteration", "StopIteration"),
    (r"aclose", "close"),
    # the integrations: the sync admission, their generated modules, httpx's names
    (r"\.\.aio", "..client"),
    (r"_(calls|streams|httpx)_async", r"_\1_sync"),
    (r"handle_async_request", "handle_request"),
    (r"aread", "read"),
    # the asyncio names of what differs: scripts' calls, the health run, the primitives
    (r"acall_confirmed", "call_confirmed"),
    (r"acall", "call"),
    (r"_aload_missing", "_load_missing"),
    (r"aload", "load"),
    (r"arun_once", "run_once"),
    (r"ablocking_calling", "blocking_calling"),
    (r"ablocking", "blocking"),
    (r"acheck_confirm", "check_confirm"),
    (r"ashielded", "shielded"),
    (r"_mesh_async", "mesh"),
    (r"aenter_in", "enter_in"),
    (r"aexit_in", "exit_in"),
    (r"arunning_loop", "running_loop"),
    (r"aend_unclosed", "end_unclosed"),
]


def _word(regex: str) -> re.Pattern:
    """``regex`` matched as whole words: a boundary at each end that is a word character."""
    start = r"\b" if re.match(r"\w", regex) else ""
    end = r"\b" if re.search(r"(?<!\\)[\w)*]$", regex) else ""
    return re.compile(start + regex + end, re.MULTILINE)


COMPILED = [(_word(regex), repl) for regex, repl in SUBS]

HEADER = ("# GENERATED from {src} by scripts/unasync.py: do not edit by hand.\n"
          "# Edit {src} and run `python scripts/unasync.py` (tests/test_unasync.py fails while this is stale).\n")


def _line(line: str, used: set[int]) -> str:
    for i, (regex, repl) in enumerate(COMPILED):
        line, n = regex.subn(repl, line)
        if n:
            used.add(i)
    return line


def _openers(text: str) -> dict[int, tuple[int, int]]:
    """For each line that starts inside brackets: (line, column) of the innermost open one."""
    inside, stack = {}, []
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.OP and tok.string in "([{":
            stack.append(tok.start)
        elif tok.type == tokenize.OP and tok.string in ")]}":
            stack.pop()
        elif tok.type in (tokenize.NL, tokenize.NEWLINE) and stack:
            inside[tok.start[0] + 1] = stack[-1]
    return inside


def unasync(text: str, src: str, used: set[int]) -> str:
    """The sync module of the asyncio source ``text``, line by line; notes in ``used`` the
    substitutions made. A continuation line aligned under its open bracket stays aligned
    (``async def f(a,`` / ``           b)`` loses six columns on both lines)."""
    lines = text.splitlines(keepends=True)
    out = [_line(line, used) for line in lines]
    moved: dict[int, int] = {}  # line -> columns its indent moved
    for row, (orow, ocol) in sorted(_openers(text).items()):
        line = lines[row - 1]
        indent = len(line) - len(line.lstrip(" "))
        if indent != ocol + 1:
            continue  # a hanging indent: nothing to realign
        shift = len(_line(lines[orow - 1][:ocol], set())) + moved.get(orow, 0) - ocol
        if shift:
            out[row - 1] = " " * (indent + shift) + out[row - 1].lstrip(" ")
            moved[row] = shift
    return HEADER.format(src=src) + "".join(out)


def main(argv: list[str]) -> int:
    check = "--check" in argv
    used: set[int] = set()
    stale = []
    for src, dst in FILES:
        expected = unasync((ROOT / src).read_text(), src, used)
        out = ROOT / dst
        actual = out.read_text() if out.exists() else None
        if actual == expected:
            continue
        if check:
            stale.append(dst)
            got, want = (actual or "").splitlines(), expected.splitlines()
            line = next((n for n, (a, b) in enumerate(zip(got, want), 1) if a != b), min(len(got), len(want)) + 1)
            print(f"{dst} is stale (generated from {src}): first difference at line {line}", file=sys.stderr)
            print(f"  expected: {want[line - 1] if line <= len(want) else '<end of file>'!r}", file=sys.stderr)
            print(f"  found:    {got[line - 1] if line <= len(got) else '<end of file>'!r}", file=sys.stderr)
        else:
            out.write_text(expected)
            print(f"{src} -> {dst}")
    unused = [SUBS[i][0] for i in range(len(SUBS)) if i not in used]
    if unused:
        print(f"substitutions no source uses (remove them): {unused}", file=sys.stderr)
        return 1
    if stale:
        print("regenerate: python scripts/unasync.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
