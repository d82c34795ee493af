"""The sync modules are generated from their asyncio source (scripts/unasync.py): a stale one,
edited by hand or not regenerated after its source changed, fails here."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "unasync.py"


def _unasync():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import unasync
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return unasync


def test_every_generated_sync_module_is_up_to_date():
    out = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_each_generated_module_says_it_is_generated_from_what_and_how_to_regenerate():
    for src, dst in _unasync().FILES:
        head = (ROOT / dst).read_text().splitlines()[:2]
        assert head[0].startswith(f"# GENERATED from {src} by scripts/unasync.py"), head
        assert "python scripts/unasync.py" in head[1], head


def test_the_check_names_a_stale_file_and_its_first_difference(tmp_path, monkeypatch):
    unasync = _unasync()
    (tmp_path / "a.py").write_text("async def f():\n    await g()\n")
    (tmp_path / "s.py").write_text("# old\n")
    monkeypatch.setattr(unasync, "ROOT", tmp_path)
    monkeypatch.setattr(unasync, "FILES", [("a.py", "s.py")])
    monkeypatch.setattr(unasync, "COMPILED", [c for c, (r, _) in zip(unasync.COMPILED, unasync.SUBS)
                                              if r in ("async def", "await ")])
    monkeypatch.setattr(unasync, "SUBS", [s for s in unasync.SUBS if s[0] in ("async def", "await ")])
    assert unasync.main(["--check"]) == 1
    assert unasync.main([]) == 0 and unasync.main(["--check"]) == 0
    assert (tmp_path / "s.py").read_text().endswith("def f():\n    g()\n")
