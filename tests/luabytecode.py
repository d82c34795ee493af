"""Lua 5.1 bytecode, read from the compiler Redis and Valkey embed (lupa's ``lua51``): what the
built library declares at its top level, the upvalues of every closure, the globals it reads.
The compiler is the real one, so its counts are the limits' own (200 locals per function, 60
upvalues per closure: Lua 5.1's LUAI_MAXVARS and LUAI_MAXUPVALUES)."""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

MAX_LOCALS = 200
MAX_UPVALUES = 60
_GETGLOBAL, _SETGLOBAL = 5, 7


@dataclass
class Function:
    line: int
    upvalues: int
    code: list[int]
    constants: list
    protos: list["Function"] = field(default_factory=list)
    locals: list[tuple[str, int, int]] = field(default_factory=list)  # name, startpc, endpc

    def walk(self):
        yield self
        for p in self.protos:
            yield from p.walk()

    def live_at_end(self) -> list[str]:
        """The locals still in scope at the function's last instruction: a chunk's top level."""
        end = len(self.code) - 1
        return [n for n, _, e in self.locals if e >= end]

    def globals(self) -> set[tuple[str, str]]:
        """(get|set, name) of every global access, in this function and those inside it."""
        out = set()
        for f in self.walk():
            for ins in f.code:
                op = ins & 0x3F
                if op in (_GETGLOBAL, _SETGLOBAL):
                    out.add(("get" if op == _GETGLOBAL else "set", f.constants[ins >> 14]))
        return out


class _Reader:
    def __init__(self, data: bytes):
        if data[:5] != b"\x1bLua\x51" or data[6:12] != bytes([1, 4, 8, 4, 8, 0]):
            raise ValueError(f"not Lua 5.1 bytecode of this layout: {data[:12]!r}")
        self.b, self.i = data, 12

    def _take(self, fmt: str):
        v = struct.unpack_from(fmt, self.b, self.i)[0]
        self.i += struct.calcsize(fmt)
        return v

    def _str(self):
        n = self._take("<Q")
        s = self.b[self.i:self.i + n - 1].decode("latin-1") if n else None
        self.i += n
        return s

    def function(self) -> Function:
        self._str()
        line = self._take("<i")
        self._take("<i")
        nups = self._take("B")
        self.i += 3  # params, vararg, stack size
        code = [self._take("<I") for _ in range(self._take("<i"))]
        consts: list = []
        for _ in range(self._take("<i")):
            t = self._take("B")
            consts.append(None if t == 0 else bool(self._take("B")) if t == 1 else self._take("<d") if t == 3
                          else self._str())
        protos = [self.function() for _ in range(self._take("<i"))]
        lines = self._take("<i")
        self.i += 4 * lines  # line info
        locs = [(self._str(), self._take("<i"), self._take("<i")) for _ in range(self._take("<i"))]
        for _ in range(self._take("<i")):
            self._str()
        return Function(line, nups, code, consts, protos, locs)


def compile_chunk(code: str, name: str = "=library") -> Function:
    """Compile with Lua 5.1 (a SyntaxError carries the compiler's message) and read it back."""
    import lupa.lua51 as lua51

    rt = lua51.LuaRuntime(encoding=None)
    loaded = rt.globals()[b"loadstring"](code.encode(), name.encode())
    if not callable(loaded):
        raise SyntaxError((loaded[1] if isinstance(loaded, tuple) else loaded).decode())
    return _Reader(bytes(rt.globals()[b"string"][b"dump"](loaded))).function()


def library_chunk(code: str) -> Function:
    """A Functions library without its shebang line."""
    return compile_chunk(code.split("\n", 1)[1])
