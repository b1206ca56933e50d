"""Load a report in headless Chromium and check it: charts drawn, no console errors, nothing fetched.

Drives Chromium through the DevTools protocol over ``--remote-debugging-pipe`` (NUL-separated JSON on
file descriptors 3 and 4), so it needs only the standard library: no websocket client, no playwright.

    python tests/browser_check.py results/report/ --shots tests/artifacts/

serves the folder on 127.0.0.1, prints what it found as JSON and exits non-zero on a problem.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-pipe",
)


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return "/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None


class CDPError(RuntimeError):
    pass


class Browser:
    """A headless Chromium and one DevTools session on one page."""

    def __init__(self, executable: str, timeout: float = 30.0):
        self.timeout = timeout
        self.events: list[dict[str, Any]] = []
        self._next_id = 0
        self._buf = b""
        self._profile = tempfile.mkdtemp(prefix="dskbench-chromium-")
        cmd_r, self._cmd_w = os.pipe()
        self._resp_r, resp_w = os.pipe()

        def child_fds() -> None:  # Chromium reads commands on fd 3 and answers on fd 4
            a, b = os.dup(cmd_r), os.dup(resp_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen(
            [executable, *CHROMIUM_FLAGS, f"--user-data-dir={self._profile}", "about:blank"],
            preexec_fn=child_fds,
            close_fds=False,  # our pipe ends are not inheritable; only fds 3 and 4 pass
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(cmd_r)
        os.close(resp_w)
        self.session: str | None = None

    def send(self, method: str, params: dict[str, Any] | None = None, session: bool = True) -> dict[str, Any]:
        self._next_id += 1
        msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise CDPError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method: str) -> dict[str, Any]:
        for ev in self.events:
            if ev.get("method") == method:
                return ev
        while True:
            ev = self._read()
            self.events.append(ev)
            if ev.get("method") == method:
                return ev

    def _read(self) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None:
                raise CDPError(
                    "no answer from chromium" + (" (it exited)" if self.proc.poll() is not None else "")
                )
            ready, _, _ = select.select([self._resp_r], [], [], left)
            if ready:
                chunk = os.read(self._resp_r, 1 << 20)
                if not chunk:
                    raise CDPError("chromium closed the DevTools pipe")
                self._buf += chunk
        raw, _, self._buf = self._buf.partition(b"\0")
        return json.loads(raw)

    def open_page(self, url: str, width: int = 1400, height: int = 1000) -> None:
        target = self.send("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
        self.session = self.send(
            "Target.attachToTarget", {"targetId": target, "flatten": True}, session=False
        )["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable")
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        self.send("Page.navigate", {"url": url})
        self.wait_event("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        res = self.send(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True}
        )
        if "exceptionDetails" in res:
            raise CDPError(f"evaluate failed: {res['exceptionDetails'].get('text')}")
        return res.get("result", {}).get("value")

    def screenshot(self, path: Path, clip: dict[str, float] | None = None) -> Path:
        import base64

        params: dict[str, Any] = {"format": "png", "captureBeyondViewport": True}
        if clip:
            params["clip"] = {**clip, "scale": 1}
        data = self.send("Page.captureScreenshot", params)["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def console_errors(self) -> list[str]:
        """Console errors, uncaught exceptions and error log entries (failed loads) seen so far."""
        out = []
        for ev in self.events:
            m, p = ev.get("method"), ev.get("params", {})
            if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append(
                    "console: " + " ".join(str(a.get("value", a.get("description", ""))) for a in p["args"])
                )
            elif m == "Runtime.exceptionThrown":
                d = p.get("exceptionDetails", {})
                out.append("exception: " + str(d.get("exception", {}).get("description") or d.get("text")))
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                out.append("log: " + str(p["entry"].get("text")) + " " + str(p["entry"].get("url", "")))
        return out

    def requested_urls(self) -> list[str]:
        return [
            ev["params"]["request"]["url"]
            for ev in self.events
            if ev.get("method") == "Network.requestWillBeSent"
        ]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.send("Browser.close", session=False)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._cmd_w, self._resp_r):
            with contextlib.suppress(OSError):
                os.close(fd)
        shutil.rmtree(self._profile, ignore_errors=True)


@contextlib.contextmanager
def serve(folder: Path) -> Iterator[str]:
    """Serve a folder on 127.0.0.1 at a free port; yields the base URL."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


PAGE_FACTS = """(() => {
  const charts = [...document.querySelectorAll('svg.chart')];
  const paths = [...document.querySelectorAll('svg.chart path.series')];
  return {
    title: document.title,
    kernels: document.querySelectorAll('details.kernel').length,
    charts: charts.length,
    charts_with_data: charts.filter(c => c.querySelector('path.series')).length,
    data_paths: paths.filter(p => /^M[\\d.]+ [\\d.]+(L[\\d.]+ [\\d.]+)+/.test(p.getAttribute('d') || '')).length,
    markers: document.querySelectorAll('svg.chart circle').length,
    throttle_rings: document.querySelectorAll('svg.chart circle.thr').length,
    rings_drawn_as_rings: [...document.querySelectorAll('svg.chart circle.thr')]
      .every(c => getComputedStyle(c).fill === 'none' && getComputedStyle(c).stroke !== 'none'),
    hollow_points: [...document.querySelectorAll('svg.chart circle.h')]
      .filter(c => getComputedStyle(c).fill === 'rgb(255, 255, 255)').length,
    error_bars: document.querySelectorAll('svg.chart path.err').length,
    cpu_banners: document.querySelectorAll('.banner').length,
    width: document.documentElement.scrollWidth,
  };
})()"""

EXPAND_ONE = """(() => {
  const k = document.getElementById(%s);
  if (!k) return null;
  k.open = true;
  const r = k.getBoundingClientRect();
  return {x: r.left + window.scrollX, y: r.top + window.scrollY, width: r.width, height: r.height};
})()"""


def check_report(
    url: str, shots: Path | None, kernel_id: str | None = None, executable: str | None = None
) -> dict:
    """Load the page, expand every kernel, collect facts, errors and requests; save screenshots."""
    exe = executable or find_chromium()
    if not exe:
        raise FileNotFoundError("chromium is not installed")
    b = Browser(exe)
    try:
        b.open_page(url)
        facts: dict[str, Any] = {}
        if shots is not None:
            facts["shots"] = [str(b.screenshot(shots / "report_top.png"))]
            if kernel_id:
                rect = b.evaluate(EXPAND_ONE % json.dumps(kernel_id))
                if rect:
                    rect["height"] = min(rect["height"], 4000)
                    facts["shots"].append(str(b.screenshot(shots / "report_kernel.png", rect)))
        b.evaluate("document.getElementById('expand')?.click()")
        facts.update(b.evaluate(PAGE_FACTS))
        time.sleep(0.2)  # let any late error surface
        b.evaluate("1")
        facts["console_errors"] = b.console_errors()
        facts["requests"] = b.requested_urls()
        return facts
    finally:
        b.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, help="a report folder holding index.html")
    ap.add_argument("--shots", type=Path, help="where to save screenshots")
    ap.add_argument("--kernel", help="id of a kernel section to screenshot, e.g. nvidia-h200--rmsnorm")
    args = ap.parse_args(argv)
    with serve(args.folder) as base:
        facts = check_report(base + "index.html", args.shots, args.kernel)
    print(json.dumps(facts, indent=1))
    foreign = [u for u in facts["requests"] if not u.startswith(base) and not u.startswith("data:")]
    bad = facts["console_errors"] or foreign or facts["charts_with_data"] == 0
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
