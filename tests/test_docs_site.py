"""The documentation site builds the way CI builds it, and stays inside the project.

* ``mkdocs build --strict`` (mkdocs.yml sets strict and warns on a page missing from the
  navigation, a broken link or anchor, and mkdocstrings fails on a name that does not exist);
* the built pages link and load nothing from outside the project (no web fonts, no CDN, no
  links to other sites: the site is read offline, as the repository is);
* the check is not a rubber stamp: a page with a broken link fails the build.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mkdocs")
pytest.importorskip("material")
pytest.importorskip("mkdocstrings")

ROOT = Path(__file__).resolve().parent.parent
MKDOCS = [sys.executable, "-m", "mkdocs"]


def build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*MKDOCS, "build", "--strict", "-f", str(config), "-d", str(site)],
                          capture_output=True, text=True, timeout=300, cwd=config.parent)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = build(ROOT / "mkdocs.yml", out)
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def test_site_builds_strict(site):
    for page in ("index.html", "tutorial/index.html", "concepts/index.html", "reference/api/index.html",
                 "reference/cli/index.html", "reference/policy/index.html", "reference/reasons/index.html",
                 "reference/metrics/index.html", "guides/troubleshoot/index.html", "design/index.html"):
        assert (site / page).is_file(), page


def test_every_docs_page_is_in_the_navigation():
    config = (ROOT / "mkdocs.yml").read_text()
    pages = sorted(p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md"))
    assert pages
    missing = [p for p in pages if f": {p}" not in config]
    assert not missing, f"pages not in mkdocs.yml's nav: {missing}"


ATTR = re.compile(r"""\b(?:href|src)=["']([^"']+)["']""")
LOCAL = re.compile(r"(https?|redis)://(127\.0\.0\.1|localhost)")


def test_built_pages_point_nowhere_outside(site):
    outside = set()
    for page in site.rglob("*.html"):
        for target in ATTR.findall(page.read_text(errors="replace")):
            if re.match(r"[a-z]+:", target) and not target.startswith(("#", "data:")) and not LOCAL.match(target):
                outside.add(f"{page.relative_to(site)}: {target}")
    assert not outside, sorted(outside)[:20]


#: an address of a host on the internet: a dotted name or a public IP (placeholders such as
#: HOST:PORT and the compose file's service names, e.g. prometheus:9090, name no such host)
PUBLIC = re.compile(r"\b[a-z][a-z0-9+.-]*://(?:[^/\s)`\"'<>@]*@)?([A-Za-z0-9-]+\.[A-Za-z0-9.-]+)")


def test_sources_point_nowhere_outside():
    assert PUBLIC.findall("see https://example.org/x, http://127.0.0.1:8000 and http://HOST:PORT") == [
        "example.org", "127.0.0.1"]
    found = []
    for path in [*(ROOT / "docs").rglob("*.md"), ROOT / "mkdocs.yml"]:
        for host in PUBLIC.findall(path.read_text()):
            if host not in ("127.0.0.1", "0.0.0.0"):
                found.append(f"{path.relative_to(ROOT)}: {host}")
    assert not found, found[:20]


def test_a_broken_link_fails_the_build(tmp_path):
    """The strict build is not a rubber stamp: the same config with one broken link fails."""
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    for name in ("admission", "scripts"):
        (tmp_path / name).symlink_to(ROOT / name)
    page = tmp_path / "docs" / "concepts.md"
    page.write_text(page.read_text() + "\n\nSee [nowhere](no-such-page.md).\n")
    done = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0
    assert "no-such-page.md" in done.stderr
