"""Flag files: a study's ``best/server-args.yaml`` read back as the candidate it deploys; every malformed one refused
at its line with a remedy; the flags held to the simulated SGLang's own table of names, types and choices."""

from __future__ import annotations

from pathlib import Path

import pytest
from elsa_history_factory import shared_template

from elsa_tune.errors import ConfigError
from elsa_tune.reports.deploy import build_bundle
from elsa_tune.reports.model import build_report
from elsa_tune.runtime.sglang_flags import sglang_flags
from elsa_tune.search_spaces.flag_file import FlagType, check_flags, parse_flag_text, read_flag_file

SIM_FLAGS: dict[str, FlagType | None] = {name[2:]: spec for spec in sglang_flags() for name in spec.names}


def test_a_studys_server_args_file_reads_back_as_the_winner(tmp_path: Path) -> None:
    report = build_report(shared_template(tmp_path).run_dir)
    bundle = build_bundle(report)
    assert bundle is not None
    path = tmp_path / "server-args.yaml"
    path.write_text(bundle.server_args_yaml)
    read = read_flag_file(path)
    assert read.dropped == ("host", "port")               # elsa-tune serves every boot on an address of its own
    assert read.candidate().key() == bundle.candidate.key()  # the same flags the study measured (rounded as deployed)
    assert read.candidate().label == "server-args"
    check_flags(read, SIM_FLAGS)                          # every flag it writes is one SGLang 0.5.23 has


def test_lines_comments_and_switches() -> None:
    text = "# A: today\nmodel-path: /models/q\n\nenable-metrics: true\ndisable-radix-cache: false\n" \
           "mem-fraction-static: 0.88\n"
    read = parse_flag_text(text, "a.yaml")
    assert read.lines == {"model-path": 2, "enable-metrics": 4, "disable-radix-cache": 5, "mem-fraction-static": 6}
    candidate = read.candidate()
    assert candidate.argv() == ["--enable-metrics", "--mem-fraction-static", "0.88", "--model-path", "/models/q"]
    assert "disable-radix-cache" not in candidate.flags     # a false switch is the flag left out


@pytest.mark.parametrize(("text", "message", "remedy"), [
    ("mem-fraction-static: [0.8\n", "a.yaml:2: malformed YAML", "fix the YAML syntax"),
    ("", "holds no flags", "one flag per line"),
    ("# only a comment\n", "holds no flags", "one flag per line"),
    ("host: 0.0.0.0\nport: 30000\n", "holds no flags but host, port", "one flag per line"),
    ("- mem-fraction-static\n", "a.yaml:1: a flag file is a mapping", "one flag per line"),
    ("just text\n", "not a YAML scalar", "one flag per line"),
    ("x: 1\n---\ny: 2\n", "malformed YAML", "fix the YAML syntax"),
    ("enable-metrics: true\nmem_fraction_static: 0.8\n", "a.yaml:2: 'mem_fraction_static' is not a flag name",
     "`mem-fraction-static`"),
    ("--mem-fraction-static: 0.8\n", "without its leading dashes", "`mem-fraction-static: …`"),
    ("1: 2\n", "the key 1 is not a flag name", "one flag per line"),
    ("mem-fraction-static: 0.8\nmem-fraction-static: 0.9\n", "a.yaml:2: mem-fraction-static is given twice "
     "(first on line 1)", "keep one line per flag"),
    ("mem-fraction-static:\n", "a.yaml:1: mem-fraction-static has no value", "delete the line"),
    ("mem-fraction-static: .nan\n", "not a finite number", "finite value"),
    ("json-model-override-args: {a: 1}\n", "is a YAML dict, not one value", "quoted text"),
    ("cuda-graph-bs: [1, 2]\n", "is a YAML list, not one value", "quoted text"),
])
def test_a_malformed_flag_file_is_refused_at_its_line(text: str, message: str, remedy: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_flag_text(text, "a.yaml")
    assert message in info.value.message and remedy in info.value.remedy


@pytest.mark.parametrize(("line", "message", "remedy"), [
    ("enable-mixed-chunks: true", "a.yaml:2: --enable-mixed-chunks is not a flag of the runtime",
     "did you mean --enable-mixed-chunk?"),
    ("enable-metrics: 3", "is a switch, not 3", "its --help"),
    ("mem-fraction-static: true", "needs a value, not true", "its --help"),
    ("max-running-requests: 2.5", "takes a whole number, not 2.5", "its --help"),
    ("max-running-requests: many", "takes a whole number, not 'many'", "its --help"),
    ("mem-fraction-static: high", "takes a number, not 'high'", "its --help"),
    ("kv-cache-dtype: fp8", "is 'fp8', not one of", "its --help"),
])
def test_a_flag_the_runtime_would_refuse_is_refused(line: str, message: str, remedy: str) -> None:
    read = parse_flag_text(f"model-path: /models/q\n{line}\n", "a.yaml")
    with pytest.raises(ConfigError) as info:
        check_flags(read, SIM_FLAGS)
    assert message in info.value.message and remedy in info.value.remedy


def test_names_only_checks_the_name() -> None:
    read = parse_flag_text("mem-fraction-static: high\n", "a.yaml")
    check_flags(read, {"mem-fraction-static": None})          # the installed runtime's --help gives no types
    with pytest.raises(ConfigError, match="not a flag of the runtime"):
        check_flags(read, {"mem-fraction": None})


def test_unreadable_files(tmp_path: Path) -> None:
    (tmp_path / "bin.yaml").write_bytes(b"\xff\xfe\x00" * 10)
    for path, message in ((tmp_path / "nope.yaml", "no such flag file"), (tmp_path, "is a folder"),
                          (tmp_path / "bin.yaml", "is not UTF-8 text")):
        with pytest.raises(ConfigError, match=message):
            read_flag_file(path)


def test_the_environment_comment_is_the_candidates_env() -> None:
    text = "# Environment (not a flag; export it first): SGLANG_X='a b'\nmodel-path: /m\n"
    assert dict(parse_flag_text(text, "a.yaml").candidate().env) == {"SGLANG_X": "a b"}
    with pytest.raises(ConfigError, match=r"a\.yaml:1: the environment comment is not one NAME=value"):
        parse_flag_text("# Environment (not a flag; export it first): 1X=2\nmodel-path: /m\n", "a.yaml")
