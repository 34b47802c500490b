"""``HeadlessChromium``: load a page in Debian's headless Chromium and read it back through the DevTools
protocol over a pipe (``--remote-debugging-pipe``: NUL-separated JSON on file descriptors 3 and 4), so the
check needs no network, no port and no websocket client.

``inspect(url)`` opens the page at a fixed viewport, waits for its load event, and returns a ``PageCheck``:
what a script evaluated in the page returned, every console message and exception the page produced, and a
PNG screenshot of the viewport.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")


@dataclass(frozen=True)
class PageCheck:
    value: Any                      # what the expression returned (JSON)
    errors: tuple[str, ...]         # console errors, uncaught exceptions, failed loads
    screenshot: bytes               # PNG of the viewport


def find_chromium() -> str | None:
    return next((path for name in CHROMIUM_NAMES if (path := shutil.which(name))), None)


class HeadlessChromium:
    def __init__(self, binary: str, *, width: int = 1280, height: int = 800, timeout_s: float = 60.0) -> None:
        self.binary, self.width, self.height, self.timeout_s = binary, width, height, timeout_s
        self._next_id = 0
        self._buffer = b""
        self._events: list[dict[str, Any]] = []

    def inspect(self, url: str, expression: str) -> PageCheck:
        with tempfile.TemporaryDirectory(prefix="elsa-chromium-") as profile:
            to_browser_r, to_browser_w = os.pipe()
            from_browser_r, from_browser_w = os.pipe()
            proc = subprocess.Popen(
                [self.binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--no-first-run", "--disable-extensions", "--disable-background-networking",
                 "--remote-debugging-pipe", f"--user-data-dir={profile}", "about:blank"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                pass_fds=(3, 4), preexec_fn=_pipes_as_3_and_4(to_browser_r, from_browser_w))
            os.close(to_browser_r)
            os.close(from_browser_w)
            self._write, self._read = to_browser_w, from_browser_r
            try:
                return self._inspect(url, expression)
            finally:
                with contextlib.suppress(OSError):
                    self._send("Browser.close")
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                os.close(to_browser_w)
                os.close(from_browser_r)

    def _inspect(self, url: str, expression: str) -> PageCheck:
        target = self._call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self._call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for method in ("Page.enable", "Runtime.enable", "Log.enable"):
            self._call(method, session=session)
        self._call("Emulation.setDeviceMetricsOverride", {"width": self.width, "height": self.height,
                                                          "deviceScaleFactor": 1, "mobile": False}, session=session)
        self._events.clear()
        navigated = self._call("Page.navigate", {"url": url}, session=session)
        if navigated.get("errorText"):
            raise RuntimeError(f"Chromium could not open {url}: {navigated['errorText']}")
        self._wait_event("Page.loadEventFired", session)
        result = self._call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                 "awaitPromise": True}, session=session)
        if "exceptionDetails" in result:
            raise RuntimeError(f"the check script failed: {result['exceptionDetails']}")
        shot = self._call("Page.captureScreenshot", {"format": "png"}, session=session)
        return PageCheck(value=result["result"].get("value"), errors=tuple(self._errors(session)),
                         screenshot=base64.b64decode(shot["data"]))

    def _errors(self, session: str) -> list[str]:
        out = []
        for event in self._events:
            if event.get("sessionId") != session:
                continue
            params = event.get("params", {})
            if event["method"] == "Runtime.exceptionThrown":
                out.append(f"exception: {params['exceptionDetails'].get('text')}")
            elif event["method"] == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                out.append("console.error: " + " ".join(str(a.get("value")) for a in params.get("args", [])))
            elif event["method"] == "Log.entryAdded" and params["entry"].get("level") == "error":
                out.append(f"log: {params['entry'].get('text')} {params['entry'].get('url', '')}".strip())
        return out

    def _send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> int:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._write, json.dumps(message).encode() + b"\0")
        return self._next_id

    def _call(self, method: str, params: dict[str, Any] | None = None, *, session: str | None = None
              ) -> dict[str, Any]:
        wanted = self._send(method, params, session)
        while True:
            message = self._receive()
            if message.get("id") == wanted:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result
            if "method" in message:
                self._events.append(message)

    def _wait_event(self, method: str, session: str) -> None:
        if any(e["method"] == method and e.get("sessionId") == session for e in self._events):
            return
        while True:
            message = self._receive()
            if "method" in message:
                self._events.append(message)
                if message["method"] == method and message.get("sessionId") == session:
                    return

    def _receive(self) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout_s
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise TimeoutError(f"Chromium sent nothing for {self.timeout_s:.0f} s")
            chunk = os.read(self._read, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium closed its DevTools pipe (it exited)")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        message: dict[str, Any] = json.loads(raw)
        return message


def _pipes_as_3_and_4(read_end: int, write_end: int) -> Callable[[], None]:
    """In the child: the browser reads commands on fd 3 and writes replies on fd 4 (copied above 10 first, so
    neither end is overwritten when a pipe already sits on 3 or 4)."""
    def setup() -> None:
        high_read, high_write = fcntl.fcntl(read_end, fcntl.F_DUPFD, 10), fcntl.fcntl(write_end, fcntl.F_DUPFD, 10)
        os.dup2(high_read, 3)
        os.dup2(high_write, 4)
    return setup


def file_url(path: Path) -> str:
    return path.resolve().as_uri()
