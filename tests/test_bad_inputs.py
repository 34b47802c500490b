"""Bad inputs reach the user as one paragraph naming the cause and the fix, a nonzero exit code, no traceback.

The three bad inputs of the issue (malformed YAML, an unknown flag, a rule no candidate can satisfy) run the
real CLI in a subprocess (``python -m elsa_tune ...``), as a user would; the other cases call the same CLI
entry point in-process (``elsa_tune.tuner.cli.main``), because every CLI start imports all commands.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from elsa_tune.tuner.cli import main

GOOD = """\
name: tiny
model:
  path: /models/tiny
base:
  flags:
    enable-metrics: true
    kv-cache-dtype: fp8_e4m3
parameters:
  mem-fraction-static: {type: float, low: 0.80, high: 0.95, step: 0.05, baseline: 0.85}
  max-running-requests: {type: int, low: 1, high: 8, baseline: 2}
rules:
  - rule: mem-fraction-static <= 0.97
techniques:
  mixed:
    kind: speed
    rationale: mixed chunks
    flags: {enable-mixed-chunk: true}
"""


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "elsa_tune", *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd, check=False)


def call_cli(capsys: pytest.CaptureFixture[str], *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI in-process, shaped like a finished subprocess."""
    code = main(list(args))
    out = capsys.readouterr()
    return subprocess.CompletedProcess(["elsa-tune", *args], code, out.out, out.err)


def assert_one_paragraph(proc: subprocess.CompletedProcess[str], *, code: int, cause: str, fix: str) -> str:
    err = proc.stderr.strip()
    assert proc.returncode == code, (proc.returncode, err)
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    assert err.startswith("elsa-tune: error: "), err
    assert "\n\n" not in err and len(err.splitlines()) <= 4, err
    assert "remedy: " in err, err
    message, remedy = err.split("remedy: ", 1)
    assert cause in message, err
    assert fix in remedy, err
    return err


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_good_space_checks_clean(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    proc = call_cli(capsys, "space", "check", str(write(tmp_path, GOOD)))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ok: tiny")


def test_malformed_yaml(tmp_path: Path) -> None:
    text = GOOD.replace("    kv-cache-dtype: fp8_e4m3", "    kv-cache-dtype: [fp8_e4m3")
    path = write(tmp_path, text)
    err = assert_one_paragraph(run_cli("space", "check", str(path), cwd=tmp_path), code=2,
                               cause="malformed YAML", fix="fix the YAML syntax")
    assert f"{path}:" in err


def test_unknown_flag_names_the_nearest(tmp_path: Path) -> None:
    text = GOOD.replace("enable-mixed-chunk: true", "enable-mixed-chunks: true")
    path = write(tmp_path, text)
    err = assert_one_paragraph(run_cli("space", "check", str(path), cwd=tmp_path), code=2,
                               cause="--enable-mixed-chunks, which the runtime does not have",
                               fix="did you mean --enable-mixed-chunk?")
    assert f"{path}:{line_of(text, 'enable-mixed-chunks')}:" in err


def test_removed_flag_of_an_older_sglang(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = GOOD.replace("    kv-cache-dtype: fp8_e4m3", "    cuda-graph-max-bs: 8")
    path = write(tmp_path, text)
    assert_one_paragraph(call_cli(capsys, "space", "check", str(path)), code=2,
                         cause="--cuda-graph-max-bs, which the runtime does not have",
                         fix="did you mean --cuda-graph-max-bs-")


def test_value_outside_the_flag_choices(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = GOOD.replace("kv-cache-dtype: fp8_e4m3", "kv-cache-dtype: fp8")
    assert_one_paragraph(call_cli(capsys, "space", "check", str(write(tmp_path, text))), code=2,
                         cause="'fp8', not one of", fix="use a value the runtime accepts")


def test_rule_no_candidate_can_satisfy(tmp_path: Path) -> None:
    text = GOOD.replace("mem-fraction-static <= 0.97", "mem-fraction-static > max-running-requests")
    path = write(tmp_path, text)
    err = assert_one_paragraph(run_cli("space", "show", str(path), cwd=tmp_path), code=2,
                               cause="no candidate of the space can satisfy rule", fix="fix the rule")
    assert f"{path}:{line_of(text, 'mem-fraction-static > max-running-requests')}:" in err


def test_bad_probe_headroom(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = GOOD + "probes:\n  headroom_floor_mib: -512\n"
    assert_one_paragraph(call_cli(capsys, "space", "check", str(write(tmp_path, text))), code=2,
                         cause="headroom_floor_mib = -512 is below the minimum", fix="fix the value")


def test_unknown_space_name_and_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert_one_paragraph(call_cli(capsys, "space", "show", "generic-sglng"), code=2,
                         cause="no shipped search space named 'generic-sglng'", fix="did you mean 'generic-sglang'?")
    assert_one_paragraph(call_cli(capsys, "space", "check", str(tmp_path / "nope.yaml")), code=2,
                         cause="does not exist", fix="give an existing YAML file")


def test_generic_space_without_a_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert_one_paragraph(call_cli(capsys, "space", "check", "generic-sglang"), code=2,
                         cause="names no model", fix="--model PATH")
    proc = call_cli(capsys, "space", "show", "generic-sglang", "--model", "/models/local")
    assert proc.returncode == 0 and "--model-path /models/local" in proc.stdout


def test_runtime_python_that_does_not_exist(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert_one_paragraph(call_cli(capsys, "space", "check", "qwen3.8-27b-nvfp4-rtx5090", "--runtime-python",
                                 str(tmp_path / "no-venv" / "python")), code=4,
                         cause="does not exist", fix="install SGLang")


@pytest.mark.sglang
def test_unknown_flag_against_the_installed_runtime(tmp_path: Path) -> None:
    python = os.environ.get("ELSA_SGLANG_PYTHON")
    if not python:
        pytest.skip("set ELSA_SGLANG_PYTHON to a python with sglang==0.5.23 installed")
    good = run_cli("space", "check", "qwen3.8-27b-nvfp4-rtx5090", "--runtime-python", python, cwd=tmp_path)
    assert good.returncode == 0, good.stderr
    assert f"the --help of {python} -m sglang.launch_server" in good.stdout
    text = GOOD.replace("enable-mixed-chunk: true", "enable-mixed-chunks: true")
    assert_one_paragraph(run_cli("space", "check", str(write(tmp_path, text)), "--runtime-python", python,
                                 cwd=tmp_path), code=2,
                         cause="--enable-mixed-chunks, which the runtime does not have",
                         fix="did you mean --enable-mixed-chunk?")


def test_a_gpu_named_twice_is_refused_with_the_remedy(capsys: pytest.CaptureFixture[str]) -> None:
    # two workers on one card would measure each other: --gpu 0,0 is a mistake, said before anything starts
    assert main(["--gpu", "0,0", "--traffic", "demo"]) == 2
    err = capsys.readouterr().err
    assert "names a GPU twice" in err and "--gpu 0,1" in err and "Traceback" not in err


COMPARE_FLAGS = (Path(__file__).parent / "e2e" / "data" / "tiny-flags.yaml").read_text()


def test_compare_a_flag_file_with_a_misspelt_flag(tmp_path: Path) -> None:
    # the installed entry point, as a user runs it: the file and line, the nearest real flag, no run folder
    (tmp_path / "a.yaml").write_text(COMPARE_FLAGS)
    text = COMPARE_FLAGS + "enable-mixed-chunks: true\n"
    (tmp_path / "b.yaml").write_text(text)
    space = str(Path(__file__).resolve().parents[1] / "benchmarks" / "workers" / "tiny-space.yaml")
    proc = run_cli("compare", "--a", "a.yaml", "--b", "b.yaml", "--gpu", "sim", "--virtual", "--sim-profile",
                   "tiny-test", "--space", space, "--out", "run", cwd=tmp_path)
    err = assert_one_paragraph(proc, code=2, cause="--enable-mixed-chunks is not a flag of the runtime",
                               fix="did you mean --enable-mixed-chunk?")
    assert f"b.yaml:{line_of(text, 'enable-mixed-chunks')}:" in err
    assert not (tmp_path / "run").exists()


def test_compare_a_flag_file_that_is_a_search_space(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a.yaml").write_text(COMPARE_FLAGS)
    space = write(tmp_path, GOOD)
    assert_one_paragraph(call_cli(capsys, "compare", "--a", str(tmp_path / "a.yaml"), "--b", str(space), "--gpu",
                                  "sim", "--virtual", "--sim-profile", "tiny-test"), code=2,
                         cause="model is a YAML dict, not one value",
                         fix="a flag takes one value")
