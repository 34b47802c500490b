"""The categories of bad input (issue 31) as generators: whatever a generator makes, the command answers in bounded
time with a result or one paragraph (exit 1–5), never an internal error, and changes no input.

Categories: numbers past the finite-number rule (huge integers, 1e308, nan, inf, 1e-300), nesting past the loader's
depth, alias bombs, values of the wrong JSON type in a record (a ledger line, a lease file), and special files. Each
property runs the CLI in-process (``elsa_tune.tuner.cli.main``) with a bounded number of examples.
"""

from __future__ import annotations

import itertools
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from bad_input_corpus import SPACE
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_bad_input_corpus import assert_refused

from elsa_tune import exit_codes
from elsa_tune.tuner.cli import main

pytestmark = pytest.mark.filterwarnings("ignore")

BOUNDED = settings(max_examples=40, deadline=20_000, derandomize=True,
                   suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

#: numbers no input may carry: past 10^15, or not finite
BAD_NUMBERS = st.one_of(
    st.integers(min_value=10**16, max_value=10**400), st.integers(min_value=-(10**400), max_value=-(10**16)),
    st.sampled_from(["1e308", "-1e308", ".nan", ".inf", "-.inf", "1e999", "1e25"]),
).map(str)


def nested(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


def bomb(levels: int, width: int) -> str:
    """A flow list whose last alias expands to ``width ** levels`` values."""
    names = [f"n{i}" for i in range(levels)]
    parts = [f"&{names[0]} [{','.join(['x'] * width)}]"]
    parts += [f"&{b} [{','.join(['*' + a] * width)}]" for a, b in itertools.pairwise(names)]
    return "[" + ", ".join(parts) + "]"


STRUCTURES = st.one_of(st.integers(33, 400).map(nested), st.tuples(st.integers(5, 9), st.integers(6, 12)).map(
    lambda lw: bomb(*lw)))
#: where a space carries a number, and where it carries a name or a mapping
SPACE_NUMBERS = ["low: 0.5", "high: 0.7", "step: 0.05", "baseline: 0.6", "high: 4", "baseline: 2",
                 "min_context_tokens: 1500", "probe_timeout_s: 60", "headroom_floor_mib: 64", "context_target: 1500"]
SPACE_SLOTS = ["name: tiny-distributed", "description: numeric", "speculative-eagle-topk: 1",
               "max-running-requests: {type: int, low: 1, high: 3, baseline: 2}"]

JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(10**30), 10**30), st.floats(allow_nan=True), st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=8)
FINGERPRINT = {"cuda": None, "driver": "simulated", "gpu_name": "tiny", "gpu_uuid": "GPU-virtual-tiny",
               "image_digest": None, "launch_command": ["elsa-tune", "sim", "serve"], "model_config_hash": None,
               "model_path": "tiny-hybrid", "power_limit_w": 200, "runtime": "sglang-sim-virtual",
               "runtime_version": "0.5.23", "schema_version": 1}
LEDGER_LINE = {"technique": "mixed-chunk", "fingerprint": FINGERPRINT, "decision": "reject", "reason": "slower",
               "date": "2026-12-04T00:00:00+00:00", "effect": 0.97, "ci_low": 0.95, "ci_high": 0.99, "boots": 6}


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


def _answer(argv: list[str], capsys: pytest.CaptureFixture[str], folder: Path, inputs: dict[Path, bytes]) -> int:
    """Run the CLI; check it answered (no internal error), refused in one paragraph if it refused, and left its
    inputs and folder as they were."""
    before = sorted(p.name for p in folder.iterdir())
    code = main(argv)
    captured = capsys.readouterr()
    assert code != exit_codes.INTERNAL and "Traceback" not in captured.err, captured.err[-2000:]
    if code != exit_codes.OK:
        assert_refused(code, captured.err, captured.out, " ".join(argv)[:200])
    for path, content in inputs.items():
        assert path.read_bytes() == content
    assert sorted(p.name for p in folder.iterdir()) == before
    return code


@BOUNDED
@given(where=st.sampled_from(SPACE_NUMBERS), value=BAD_NUMBERS)
def test_a_number_past_the_rule_anywhere_in_a_space_is_refused(where: str, value: str,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    key = where.split(":")[0]
    text = SPACE.replace(where, f"{key}: {value}", 1)
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "space.yaml"
        path.write_text(text)
        code = _answer(["space", "check", str(path)], capsys, Path(scratch), {path: text.encode()})
        assert code != exit_codes.OK or where not in SPACE, (where, value)


@BOUNDED
@given(where=st.sampled_from(SPACE_SLOTS), structure=STRUCTURES)
def test_nesting_or_an_alias_bomb_anywhere_in_a_space_is_refused_in_bounded_time(
        where: str, structure: str, capsys: pytest.CaptureFixture[str]) -> None:
    key = where.split(":")[0]
    text = SPACE.replace(where, f"{key}: {structure}", 1)
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "space.yaml"
        path.write_text(text)
        assert _answer(["space", "check", str(path)], capsys, Path(scratch), {path: text.encode()}) != exit_codes.OK


@BOUNDED
@given(flag=st.sampled_from(["mem-fraction-static", "chunked-prefill-size", "page-size", "schedule-conservativeness"]),
       value=st.one_of(BAD_NUMBERS, STRUCTURES), as_key=st.booleans())
def test_a_flag_file_with_a_bad_number_or_structure_is_refused(flag: str, value: str, as_key: bool,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    from bad_input_corpus import FLAGS

    line = f"? {value}\n: 1\n" if as_key else f"{flag}: {value}\n"
    text = FLAGS.replace("mem-fraction-static: 0.6\n", "") + line
    with tempfile.TemporaryDirectory() as scratch:
        a, b = Path(scratch) / "a.yaml", Path(scratch) / "b.yaml"
        a.write_text(FLAGS)
        b.write_text(text)
        code = _answer(["compare", "--gpu", "sim", "--virtual", "--sim-profile", "tiny-test", "--a", str(a), "--b",
                        str(b), "--out", str(Path(scratch) / "cmp")], capsys, Path(scratch),
                       {a: FLAGS.encode(), b: text.encode()})
        assert code in exit_codes.BAD_INPUT


@BOUNDED
@given(field=st.sampled_from(sorted(LEDGER_LINE)), value=JSON_VALUES)
def test_a_ledger_line_of_the_wrong_type_is_a_corrupt_line_named_by_file_and_line(
        field: str, value: object, capsys: pytest.CaptureFixture[str]) -> None:
    line = json.dumps({**LEDGER_LINE, field: value})
    text = json.dumps(LEDGER_LINE) + "\n" + line + "\n"
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "ledger.jsonl"
        path.write_text(text)
        code = main(["ledger", "--all", str(scratch)])
        captured = capsys.readouterr()
        assert code == exit_codes.OK and "Traceback" not in captured.err, captured.err[-2000:]
        assert path.read_text() == text
        if "corrupt ledger line" in captured.err:
            assert f"{path}:2" in captured.err or "ledger.jsonl:2" in captured.err, captured.err


@BOUNDED
@given(content=st.one_of(JSON_VALUES.map(json.dumps), st.integers(33, 200_000).map(lambda n: "[" * n),
                         st.binary(max_size=200).map(lambda b: b.decode("latin-1"))))
def test_a_lease_file_of_any_shape_never_stops_a_preflight(content: str, capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        lease = Path(scratch) / "x.lease.json"
        lease.write_text(content, encoding="latin-1")
        monkeypatch.setenv("ELSA_LEASE_DIR", scratch)
        code = main(["leases", "--dir", scratch])
        captured = capsys.readouterr()
        assert code == exit_codes.OK and "Traceback" not in captured.err, captured.err[-2000:]
        assert lease.read_text(encoding="latin-1") == content


@pytest.mark.parametrize("make", ["fifo", "device"])
@pytest.mark.parametrize("argv", [
    ["space", "check", "{f}"], ["log", "explain", "{f}"], ["traffic", "show", "{f}"],
    ["traffic", "import", "{f}", "--format", "mooncake", "-o", "{d}/o.parquet"],
    ["sim", "truth", "--sim-profile", "tiny-test", "--workload", "{f}"],
    ["compare", "--gpu", "sim", "--virtual", "--sim-profile", "tiny-test", "--a", "{f}", "--b", "{f}", "--out",
     "{d}/cmp"],
], ids=lambda a: " ".join(a[:2]) if isinstance(a, list) else a)
def test_a_special_file_as_an_input_is_refused_without_reading_it(
        make: str, argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    special = tmp_path / "special"
    if make == "fifo":
        os.mkfifo(special)
    else:
        special = Path("/dev/zero")
    args = [a.replace("{f}", str(special)).replace("{d}", str(tmp_path)) for a in argv]
    _answer(args, capsys, tmp_path, {})
