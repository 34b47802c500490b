"""A fake Docker Engine HTTP API for testing ``SGLangDocker`` through the real docker SDK.

It answers the endpoints the SDK calls (create, list with label filters, inspect, start, logs with the
multiplexed stream framing, wait, stop, kill, remove), records every request (method, path, query, JSON
body), and runs a "container" as a local process: the image ``fake/sglang:test`` runs ``fake_sglang.py`` with the
container's command (its ``python3 -m sglang.launch_server`` replaced, ``--port 30000`` replaced by
the published host port, ``--host 0.0.0.0`` by ``127.0.0.1``) and the container's ``Env``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import struct
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

IMAGE = "fake/sglang:test"
FAKE_SERVER = Path(__file__).with_name("fake_sglang.py")


def _group_alive(pgid: int) -> bool:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rfind(")") + 2:].split()
            if fields[0] != "Z" and fields[2] == str(pgid):
                return True
    return False


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, list[str]]
    body: Any


@dataclass
class FakeContainer:
    id: str
    name: str
    spec: dict[str, Any]
    proc: subprocess.Popen[bytes] | None = None
    output: bytearray = field(default_factory=bytearray)
    removed: bool = False
    cond: threading.Condition = field(default_factory=threading.Condition)

    @property
    def exit_code(self) -> int | None:
        if self.proc is None or self.proc.poll() is None:
            return None
        code = self.proc.returncode
        return 128 - code if code < 0 else code

    @property
    def status(self) -> str:
        if self.proc is None:
            return "created"
        return "running" if self.proc.poll() is None else "exited"


class FakeDockerEngine:
    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self.containers: dict[str, FakeContainer] = {}
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                engine.handle(self, "GET")

            def do_POST(self) -> None:
                engine.handle(self, "POST")

            def do_DELETE(self) -> None:
                engine.handle(self, "DELETE")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base_url(self) -> str:
        return f"tcp://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        for container in self.containers.values():
            self._kill(container, signal.SIGKILL)
        self.httpd.shutdown()
        self.httpd.server_close()

    def created(self) -> list[Recorded]:
        return [r for r in self.requests if r.method == "POST" and r.path == "/containers/create"]

    def live(self) -> list[str]:
        return [c.name for c in self.containers.values() if not c.removed or c.status == "running"]

    # ---- routing ------------------------------------------------------------------------------------

    def handle(self, req: BaseHTTPRequestHandler, method: str) -> None:
        url = urlparse(req.path)
        path = url.path
        if path.startswith("/v1."):
            path = path[path.index("/", 1):]
        query = parse_qs(url.query)
        length = int(req.headers.get("Content-Length") or 0)
        raw = req.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else None
        self.requests.append(Recorded(method, path, query, body))
        parts = path.strip("/").split("/")
        if path in ("/_ping",):
            return self._send(req, 200, b"OK", "text/plain")
        if path == "/version":
            return self._json(req, 200, {"ApiVersion": "1.43", "Version": "fake"})
        if method == "POST" and path == "/containers/create":
            return self._create(req, query, body or {})
        if method == "GET" and path == "/containers/json":
            return self._json(req, 200, self._list(query))
        if len(parts) >= 2 and parts[0] == "containers":
            container = self.containers.get(parts[1])
            if container is None or (container.removed and method != "DELETE"):
                return self._json(req, 404, {"message": f"No such container: {parts[1]}"})
            action = parts[2] if len(parts) > 2 else ""
            if method == "GET" and action == "json":
                return self._json(req, 200, self._inspect(container))
            if method == "POST" and action == "start":
                self._start(container)
                return self._send(req, 204, b"")
            if method == "GET" and action == "logs":
                return self._logs(req, container, follow=query.get("follow", ["0"])[0] in ("1", "true", "True"))
            if method == "POST" and action == "wait":
                if container.proc is not None:
                    container.proc.wait(timeout=120)
                return self._json(req, 200, {"StatusCode": container.exit_code or 0, "Error": None})
            if method == "POST" and action == "stop":
                if container.status != "running":
                    return self._send(req, 304, b"")
                self._stop(container, float(query.get("t", ["10"])[0]))
                return self._send(req, 204, b"")
            if method == "POST" and action == "kill":
                self._kill(container, getattr(signal, query.get("signal", ["SIGKILL"])[0]))
                return self._send(req, 204, b"")
            if method == "DELETE" and action == "":
                self._kill(container, signal.SIGKILL)
                container.removed = True
                return self._send(req, 204, b"")
        return self._json(req, 404, {"message": f"page not found: {method} {path}"})

    # ---- containers ---------------------------------------------------------------------------------

    def _create(self, req: BaseHTTPRequestHandler, query: dict[str, list[str]], spec: dict[str, Any]) -> None:
        if spec.get("Image") != IMAGE:
            return self._json(req, 404, {"message": f"No such image: {spec.get('Image')}"})
        container = FakeContainer(uuid.uuid4().hex + uuid.uuid4().hex, query.get("name", [""])[0], spec)
        self.containers[container.id] = container
        self._json(req, 201, {"Id": container.id, "Warnings": []})

    def _list(self, query: dict[str, list[str]]) -> list[dict[str, Any]]:
        """``GET /containers/json``: running ones, or all with ``all=1``; ``filters={"label": ["k" | "k=v"]}``."""
        wanted = json.loads(query.get("filters", ["{}"])[0]).get("label", [])
        every = query.get("all", ["0"])[0] in ("1", "true", "True")
        found = []
        for c in self.containers.values():
            labels = c.spec.get("Labels") or {}
            if c.removed or not (every or c.status == "running"):
                continue
            if all(f.split("=", 1)[0] in labels and ("=" not in f or labels[f.split("=", 1)[0]] == f.split("=", 1)[1])
                   for f in wanted):
                found.append({"Id": c.id, "Names": ["/" + c.name], "Image": c.spec.get("Image"), "Labels": labels,
                              "State": c.status})
        return found

    def _inspect(self, c: FakeContainer) -> dict[str, Any]:
        return {"Id": c.id, "Name": "/" + c.name, "Image": c.spec.get("Image"),
                "Config": {"Tty": False, "Image": c.spec.get("Image"), "Cmd": c.spec.get("Cmd"),
                           "Env": c.spec.get("Env"), "Labels": c.spec.get("Labels")},
                "HostConfig": c.spec.get("HostConfig", {}),
                "State": {"Status": c.status, "Running": c.status == "running", "ExitCode": c.exit_code or 0}}

    def _start(self, c: FakeContainer) -> None:
        cmd = list(c.spec["Cmd"])
        host_port = c.spec["HostConfig"]["PortBindings"]["30000/tcp"][0]["HostPort"]
        cmd = [sys.executable, str(FAKE_SERVER), *cmd[3:]]
        cmd[cmd.index("--port") + 1] = str(host_port)
        cmd[cmd.index("--host") + 1] = "127.0.0.1"
        env = dict(os.environ)
        env.update(dict(item.split("=", 1) for item in c.spec.get("Env") or []))
        c.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, start_new_session=True)
        threading.Thread(target=self._pump, args=(c,), daemon=True).start()

    def _pump(self, c: FakeContainer) -> None:
        assert c.proc is not None and c.proc.stdout is not None
        for line in iter(c.proc.stdout.readline, b""):
            with c.cond:
                c.output.extend(line)
                c.cond.notify_all()
        c.proc.wait()
        c.proc.stdout.close()
        with c.cond:
            c.cond.notify_all()

    def _stop(self, c: FakeContainer, grace: float) -> None:
        self._kill(c, signal.SIGTERM)
        assert c.proc is not None
        try:
            c.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self._kill(c, signal.SIGKILL)
            c.proc.wait(timeout=30)

    def _kill(self, c: FakeContainer, sig: int) -> None:
        if c.proc is not None and c.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(c.proc.pid, sig)
        if sig == signal.SIGKILL and c.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(c.proc.pid, signal.SIGKILL)   # the "container" is the whole group
            c.proc.wait(timeout=30)
            deadline = time.monotonic() + 10
            while _group_alive(c.proc.pid) and time.monotonic() < deadline:   # like a cgroup kill: all gone
                time.sleep(0.02)

    def _logs(self, req: BaseHTTPRequestHandler, c: FakeContainer, follow: bool) -> None:
        req.send_response(200)
        req.send_header("Content-Type", "application/vnd.docker.raw-stream")
        req.end_headers()
        sent = 0
        while True:
            with c.cond:
                while follow and sent == len(c.output) and c.status == "running":
                    c.cond.wait(timeout=0.5)
                chunk = bytes(c.output[sent:])
                done = c.status != "running"
            if chunk:
                try:
                    req.wfile.write(struct.pack(">BxxxL", 1, len(chunk)) + chunk)
                    req.wfile.flush()
                except OSError:
                    return
                sent += len(chunk)
            if not follow or (done and sent == len(c.output)):
                return

    # ---- replies ------------------------------------------------------------------------------------

    def _json(self, req: BaseHTTPRequestHandler, code: int, data: Any) -> None:
        self._send(req, code, json.dumps(data).encode(), "application/json")

    def _send(self, req: BaseHTTPRequestHandler, code: int, body: bytes, kind: str = "application/json") -> None:
        req.send_response(code)
        if code not in (204, 304):
            req.send_header("Content-Type", kind)
            req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        if body and code not in (204, 304):
            req.wfile.write(body)
