"""Every case of the bad-input corpus: exit 1–5, one paragraph with a remedy, no traceback, no file touched.

The CLI runs in-process (``elsa_tune.tuner.cli.main``), so the whole corpus costs seconds; three cases run the
installed entry point in a subprocess to show that nothing else reaches stderr. A property test (hypothesis)
hands every file-reading command arbitrary bytes: whatever it says, it never ends in an internal error, and its
input is never changed.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from bad_input_corpus import CASES, Case, snapshot, write_files
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from elsa_tune import exit_codes
from elsa_tune.tuner.cli import main

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    write_files(root)
    return root


def assert_refused(code: int, err: str, out: str, what: str) -> None:
    assert code in exit_codes.BAD_INPUT, (what, code, err[-2000:])
    assert "Traceback" not in err and "Traceback" not in out, (what, err)
    text = err.strip()
    assert text.startswith("elsa-tune: error: "), (what, text)
    assert "\n\n" not in text and len(text.splitlines()) <= 6, (what, text)
    assert "\n  remedy: " in text and text.split("\n  remedy: ", 1)[1].strip(), (what, text)


def test_the_corpus_holds_the_issues_cases_and_at_least_150() -> None:
    names = {c.name for c in CASES}
    assert len(CASES) >= 150 and len(names) == len(CASES)
    for must in ("import onto its input", "import onto a folder", "import into /proc", "study --out a file",
                 "study --log-file a folder", "study --sim-speedup nan", "show --bins 0", "show --bins -3",
                 "gate plan --sigma-boot 'nan'", "import mc-huge-output.jsonl", "import az-huge.csv",
                 "worker --storage notadb://x/y", "worker --storage sqlite:////proc/x/db", "sim truth binary workload",
                 "show meta-not-utf8.parquet", "space check space-huge-rule.yaml", "space check space-inf.yaml",
                 "log explain binary.dat", "show --window 0", "show --window nan", "import block size 0",
                 "leases --dir a file", "leases --dir missing", "worker --heartbeat 0", "worker --grace -1"):
        assert must in names, must


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_bad_input_is_refused_in_one_paragraph_and_changes_nothing(
        case: Case, corpus: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(corpus)
    before = snapshot(corpus)
    code = main(case.args(corpus))
    captured = capsys.readouterr()
    assert_refused(code, captured.err, captured.out, case.name)
    assert snapshot(corpus) == before, case.name


@pytest.mark.parametrize("name", ["import onto its input", "study --sim-speedup nan", "show meta-not-utf8.parquet"])
def test_the_installed_command_prints_no_traceback(name: str, corpus: Path) -> None:
    case = next(c for c in CASES if c.name == name)
    before = snapshot(corpus)
    done = subprocess.run([sys.executable, "-m", "elsa_tune", *case.args(corpus)], capture_output=True, text=True,
                          cwd=corpus, timeout=120, check=False)
    assert_refused(done.returncode, done.stderr, done.stdout, name)
    assert snapshot(corpus) == before


READERS = [
    ("traffic", "import", "{f}", "--format", "mooncake", "-o", "{o}"),
    ("traffic", "import", "{f}", "--format", "azure", "-o", "{o}"),
    ("traffic", "import", "{f}", "--format", "openai-jsonl", "-o", "{o}", "--breakers-sample", "5"),
    ("traffic", "import", "{f}", "--format", "mooncake", "-o", "{o}", "--skip-bad"),
    ("traffic", "show", "{f}"),
    ("log", "explain", "{f}"),
    ("space", "check", "{f}"),
    ("sim", "truth", "--sim-profile", "tiny-test", "--workload", "{f}"),
    ("ledger", "{f}"),
]

_JSON_LINE = st.fixed_dictionaries({}, optional={
    "timestamp": st.one_of(st.integers(-10, 10**13), st.floats(allow_nan=True, allow_infinity=True)),
    "input_length": st.one_of(st.integers(-5, 10**10), st.floats(), st.text(max_size=3)),
    "output_length": st.one_of(st.integers(-5, 10**10), st.floats(), st.booleans()),
    "hash_ids": st.lists(st.integers(-(2**70), 2**70), max_size=4),
    "created": st.one_of(st.integers(), st.floats(), st.text(max_size=8)),
    "messages": st.lists(st.one_of(st.text(max_size=5),
                                   st.fixed_dictionaries({"role": st.sampled_from(["user", "tool"]),
                                                          "content": st.text(max_size=20)})), max_size=2),
})


def _content() -> st.SearchStrategy[bytes]:
    import json

    lines = st.lists(_JSON_LINE.map(lambda d: json.dumps(d, allow_nan=True)), min_size=1, max_size=4)
    csv_rows = st.lists(st.tuples(st.sampled_from(["2023-11-16 18:15:46", "x", ""]), st.integers(-3, 10**12),
                                  st.integers(-3, 10**12)), max_size=3)
    return st.one_of(
        st.binary(max_size=2000),
        st.text(max_size=500).map(str.encode),
        lines.map(lambda ls: ("\n".join(ls) + "\n").encode()),
        csv_rows.map(lambda rows: ("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                   + "".join(f"{a},{b},{c}\n" for a, b, c in rows)).encode()),
    )


@settings(max_examples=120, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(reader=st.sampled_from(READERS), content=_content())
def test_any_bytes_to_any_reader_end_in_an_answer_never_an_internal_error(
        reader: tuple[str, ...], content: bytes, capsys: pytest.CaptureFixture[str]) -> None:
    with _scratch() as folder:
        source = folder / "input"
        source.write_bytes(content)
        argv = [a.replace("{f}", str(source)).replace("{o}", str(folder / "out.parquet")) for a in reader]
        code = main(argv)
        captured = capsys.readouterr()
        assert source.read_bytes() == content
        assert code != exit_codes.INTERNAL and "Traceback" not in captured.err, captured.err
        if code != exit_codes.OK:
            assert_refused(code, captured.err, captured.out, " ".join(reader))
        created = {p.name for p in folder.iterdir()} - {"input"}
        assert created <= ({"out.parquet"} if code == exit_codes.OK else set()), created


@pytest.fixture(autouse=True)
def _quiet_logging() -> Iterator[None]:
    import logging

    root = logging.getLogger("elsa_tune")
    handlers = list(root.handlers)
    yield
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
            handler.close()


class _scratch:
    """A temporary folder for one hypothesis example (function-scoped fixtures are shared between examples)."""

    def __enter__(self) -> Path:
        self._tmp = tempfile.TemporaryDirectory()
        return Path(self._tmp.name)

    def __exit__(self, *exc: object) -> None:
        self._tmp.cleanup()


def test_a_corrupt_ledger_line_is_warned_about_once(corpus: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ledger", str(corpus / "ledger")]) == exit_codes.OK   # the other lines still count
    err = capsys.readouterr().err
    assert err.count("corrupt ledger line") == 1 and "Traceback" not in err, err


@pytest.mark.parametrize("answer", [
    {"metric": {}, "values": [["NOW", "abc"]]},
    {"metric": {}, "values": [["NOW", "+Inf"]]},    # no sample: the window then has no counters
    {"values": [["NOW", "1"]]},                     # no metric
    {"metric": {}, "values": [["now", "1"]]},
    {"metric": {}, "values": [["NOW"]]},
    {"metric": "job", "values": [["NOW", "1"]]},
    {"metric": {}, "values": "many"},
], ids=["value abc", "value +Inf", "no metric", "time now", "no value", "metric a string", "values a string"])
def test_a_prometheus_answer_of_the_wrong_shape_is_refused(answer: dict[str, object], corpus: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """A server that speaks Prometheus's envelope but answers ``query_range`` with a malformed series."""
    import json
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.startswith("/api/v1/query_range"):   # a sample inside the recorded window
                result = json.loads(json.dumps(answer).replace('"NOW"', str(time.time() - 120)))
                data: dict[str, object] = {"resultType": "matrix", "result": [result]}
            else:
                data = {"resultType": "vector", "result": [{"metric": {}, "value": [1.0, "1"]}]}
            body = json.dumps({"status": "success", "data": data}).encode()
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
    try:
        before = snapshot(corpus)
        code = main(["record", "--prometheus", f"http://127.0.0.1:{server.server_port}", "--since", "1h", "-o",
                     str(corpus / "recorded.parquet"), "--timeout", "10"])
        captured = capsys.readouterr()
        assert_refused(code, captured.err, captured.out, str(answer))
        expected = "no SGLang request counters" if "+Inf" in str(answer) else "not Prometheus's shape"
        assert expected in captured.err, captured.err
        assert snapshot(corpus) == before
    finally:
        server.shutdown()
        server.server_close()
