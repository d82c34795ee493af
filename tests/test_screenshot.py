"""scripts/screenshot.py: the picture of the live page in the docs (docs/images/live-page.png)
comes out of a real run -- an embedded server, the fake provider, demo pods, ``admission serve``
and headless Chromium -- as a valid, non-trivial PNG. Skipped without Chromium, except in CI
(which installs it: .ci/run)."""
from __future__ import annotations

import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from admission.tools.servers import available_engines

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "screenshot.py"
CHROMIUM = "/usr/bin/chromium"
CI = os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")

pytestmark = pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK) and not CI,
                                reason=f"{CHROMIUM} not installed (apt-get install chromium; CI installs it)")


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk, its signature and CRC checked."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13
    body, crc = data[16:29], struct.unpack(">I", data[29:33])[0]
    assert zlib.crc32(b"IHDR" + body) == crc, "IHDR CRC"
    assert data.endswith(b"IEND\xaeB`\x82"), "no IEND chunk"
    return struct.unpack(">II", body[:8])


def test_screenshot_script_writes_the_live_page(tmp_path):
    if not available_engines():
        pytest.skip("no redis-server or valkey-server")
    out = tmp_path / "page.png"
    done = subprocess.run([sys.executable, str(SCRIPT), "--seconds", "6", "--pods", "2", "--out", str(out)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    data = out.read_bytes()
    assert png_size(data) == (1280, 900)
    assert len(data) > 50_000, len(data)  # a blank or error page compresses to a few kB
    assert f"wrote {out}" in done.stderr


def test_the_docs_picture_is_a_png():
    data = (ROOT / "docs" / "images" / "live-page.png").read_bytes()
    assert png_size(data) == (1280, 900) and len(data) > 50_000
