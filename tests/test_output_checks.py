"""Every output goes through the one output check before anything is queried, read or opened (issue 31, data loss 3
and 4): only regular files are ever replaced, ``record`` asks Prometheus nothing for an output it cannot write, and
``worker --ledger`` / ``--log-file`` (``--dry-run`` included) never append to a search space."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from elsa_tune import exit_codes
from elsa_tune.tuner.cli import main

REPO = Path(__file__).resolve().parent.parent
TINY_SPACE = REPO / "benchmarks" / "workers" / "tiny-space.yaml"
MOONCAKE = json.dumps({"timestamp": 0, "input_length": 600, "output_length": 20, "hash_ids": [1, 2]}) + "\n"

pytestmark = pytest.mark.filterwarnings("ignore")


def refused(capsys: pytest.CaptureFixture[str], argv: list[str], *, cause: str, code: int = exit_codes.USAGE) -> str:
    got = main(argv)
    err = capsys.readouterr().err.strip()
    assert got == code, (got, err[-2000:])
    assert "Traceback" not in err and err.startswith("elsa-tune: error: ") and "\n  remedy: " in err, err
    assert cause in err, err
    return err


@pytest.fixture()
def prometheus() -> Iterator[list[str]]:
    """A server that answers every query as Prometheus would with no series; yields the paths it was asked."""
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            kind = "matrix" if self.path.startswith("/api/v1/query_range") else "vector"
            body = json.dumps({"status": "success", "data": {"resultType": kind, "result": []}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    asked.append(f"http://127.0.0.1:{server.server_port}")
    try:
        yield asked
    finally:
        server.shutdown()
        server.server_close()


def test_record_checks_its_output_before_the_first_query(prometheus: list[str], tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    url = prometheus.pop(0)
    (tmp_path / "folder").mkdir()
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    for output, cause in ((tmp_path / "folder", "is a folder, not a file"),
                          (Path("/proc/self/t.parquet"), "is inside /proc"),
                          (tmp_path / "fifo", "is a FIFO (named pipe), not a regular file"),
                          (tmp_path / "loop", "cannot be followed")):
        refused(capsys, ["record", "--prometheus", url, "--since", "1h", "--timeout", "5", "-o", str(output)],
                cause=cause)
        assert prometheus == [], f"-o {output}: Prometheus was queried before the output was checked"
    assert stat.S_ISFIFO((tmp_path / "fifo").stat().st_mode) and (tmp_path / "loop").is_symlink()


def test_traffic_import_never_replaces_a_fifo_or_a_device(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "t.jsonl"
    source.write_text(MOONCAKE)
    os.mkfifo(tmp_path / "fifo")
    outputs = [(tmp_path / "fifo", "is a FIFO (named pipe)", stat.S_ISFIFO)]
    try:   # a character device outside /dev (``mknod n c 1 3``: the system's null device) needs CAP_MKNOD
        os.mknod(tmp_path / "null", 0o644 | stat.S_IFCHR, os.makedev(1, 3))
        outputs.append((tmp_path / "null", "is a character device", stat.S_ISCHR))
    except PermissionError:
        pass
    for output, cause, kind in outputs:
        refused(capsys, ["traffic", "import", str(source), "--format", "mooncake", "-o", str(output)], cause=cause)
        assert kind(output.stat().st_mode), f"{output} was replaced"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["t.jsonl", *(o.name for o, _, _ in outputs)])


def test_a_looping_link_as_a_run_folder_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "l").symlink_to(tmp_path / "l")
    refused(capsys, ["--gpu", "sim", "--sim-profile", "tiny-test", "--space", str(TINY_SPACE), "--traffic", "demo",
                     "--virtual", "--budget", "1m", "--out", str(tmp_path / "l")], cause="--out")
    assert [p.name for p in tmp_path.iterdir()] == ["l"]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_worker_never_appends_to_a_search_space(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    space = tmp_path / "s.yaml"
    space.write_text(TINY_SPACE.read_text())
    other = tmp_path / "notes.yaml"
    other.write_text(TINY_SPACE.read_text())
    before = {p.name: _digest(p) for p in (space, other)}
    worker = ["worker", "--study", "s", "--gpu", "0", "--runtime", "sim", "--sim-profile", "tiny-test", "--traffic",
              "demo", "--out", str(tmp_path / "wk"), "--budget", "5s"]
    refused(capsys, [*worker, "--space", str(space), "--ledger", str(space)], cause="--ledger")
    refused(capsys, [*worker, "--space", "tiny-distributed", "--ledger", str(other)],
            cause="is not a ledger (no line of it is a JSON ledger entry)")
    refused(capsys, [*worker, "--space", str(space), "--log-file", str(space)], cause="--log-file")
    assert {p.name: _digest(p) for p in (space, other)} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.yaml", "s.yaml"], "a refused worker created files"


def test_a_dry_run_checks_its_log_file_before_opening_it(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    space = tmp_path / "s.yaml"
    space.write_text(TINY_SPACE.read_text())
    before = _digest(space)
    refused(capsys, ["--gpu", "sim", "--sim-profile", "tiny-test", "--space", str(space), "--traffic", "demo",
                     "--dry-run", "--log-file", str(space)], cause="--log-file")
    os.mkfifo(tmp_path / "fifo")
    refused(capsys, ["--gpu", "sim", "--sim-profile", "tiny-test", "--space", str(space), "--traffic", "demo",
                     "--dry-run", "--log-file", str(tmp_path / "fifo")], cause="is a FIFO")
    assert _digest(space) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "s.yaml"]


def test_a_ledger_with_a_torn_line_is_still_a_ledger(tmp_path: Path) -> None:
    from elsa_tune.history.ledger import JsonlLedger

    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text('{"technique": "x", "tor\n{"technique": "y"}\n')
    assert not JsonlLedger(ledger).is_foreign()
    assert not JsonlLedger(tmp_path / "new.jsonl").is_foreign()
    (tmp_path / "space.yaml").write_text(TINY_SPACE.read_text())
    assert JsonlLedger(tmp_path / "space.yaml").is_foreign()
