from __future__ import annotations

import dataclasses
import json
import os
import shutil
import stat
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml
from elsa_history_factory import WINNER, XSS, HistoryBuilder, copy_history, gpu_state

from elsa_tune.history.decision import DecisionRecord
from elsa_tune.history.records import Phase
from elsa_tune.reports.build import Outputs, write_outputs
from elsa_tune.reports.deploy import launch_script, server_argv
from elsa_tune.reports.model import build_report


@pytest.fixture(scope="module")
def outputs(history_template: HistoryBuilder, tmp_path_factory: pytest.TempPathFactory) -> Outputs:
    h = copy_history(history_template, tmp_path_factory.mktemp("reports"))
    return write_outputs(h.run_dir)


def test_markdown_has_the_tables_and_numbers(outputs: Outputs) -> None:
    md = outputs.markdown.read_text()
    assert "| Tried | Result | Kept? |" in md
    assert ("| hicache (`--enable-hierarchical-cache`) | crashes: AttributeError: 'HybridLinearKVPool' object has "
            "no attribute 'layer_num'") in md
    assert ("| mixed-chunk (`--enable-mixed-chunk`) | accepted and silently ignored: server_args shows False "
            "| No |") in md
    assert "| attention-backend triton (`--attention-backend triton`) | +11% at short prompts, −63% at 50K | No |" in md
    assert "no demonstrated benefit: +1.2% [−4%, +7%] over 12 boots" in md and "No (inconclusive)" in md
    assert "| page-size 32 (`--page-size 32`) | +5.2% [+2%, +9%] over 6 boots | Yes |" in md
    assert "winner vs baseline: +11% [+6%, +16%] over 6 boots (confirmed by the gate)" in md
    assert "- `--max-running-requests 1 → 2`" in md and "- `--page-size 16 → 32`" in md
    assert "σ_boot (restart to restart): 3.1%" in md and "reads -12.7% vs steady state" in md
    assert "| --max-running-requests | 4 | 2 | max_running_requests=2 |" in md
    assert "| 0015-slots-4 | search | slots-4 | probe_failed | 12 MiB | 33,440 | 4 | n/a |" in md
    assert "**max_total_num_tokens (what really fits):** 100,480" in md
    assert "not the declared --context-length 159,776" in md
    assert "complete" in md and "infeasible (oom_under_load)" in md     # the numeric search table
    assert XSS not in md and "&lt;script&gt;alert(1)&lt;/script&gt;" in md


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.srcs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.srcs += [v or "" for k, v in attrs if k in ("src", "href")]


def test_html_is_self_contained_and_escapes_log_text(outputs: Outputs) -> None:
    page = outputs.html.read_text()
    assert XSS not in page and "alert(1)" in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    parser = _Tags()
    parser.feed(page)
    assert "script" not in parser.tags and "link" not in parser.tags
    assert len(parser.srcs) == 3 and all(s.startswith("data:image/png;base64,") for s in parser.srcs)
    for text in ("Tried", "Kept?", "page-size 32", "100,480", "3.1%", "−63% at 50K", "slots-4", "12 MiB",
                 "HybridLinearKVPool"):
        assert text in page


def test_best_folder_is_deployable(outputs: Outputs) -> None:
    assert outputs.best is not None
    launch = outputs.best / "launch.sh"
    assert launch.stat().st_mode & stat.S_IXUSR
    subprocess.run(["bash", "-n", str(launch)], check=True, timeout=30)
    text = launch.read_text()
    assert f"export CUDA_VISIBLE_DEVICES={gpu_state().uuid}" in text and "export SGLANG_ENABLE_SPEC_V2=1" in text
    compose = yaml.safe_load((outputs.best / "docker-compose.yml").read_text())
    service = compose["services"]["sglang"]
    assert service["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] == [gpu_state().uuid]
    assert service["ports"] == ["127.0.0.1:30000:30000"] and "shm_size" not in service
    assert service["ipc"] == "host" and service["ulimits"] == {"memlock": -1, "stack": 67108864}
    assert service["image"] == "lmsysorg/sglang@sha256:0123456789abcdef"
    assert service["volumes"] == ["${HOME}/.cache/huggingface:/root/.cache/huggingface",
                                  "/models/qwen:/models/qwen:ro"]
    command = service["command"]
    assert command[command.index("--page-size") + 1] == "32" and command[command.index("--host") + 1] == "0.0.0.0"
    assert service["environment"] == {"HF_TOKEN": "${HF_TOKEN:-}", "SGLANG_ENABLE_SPEC_V2": "1"}
    args = yaml.safe_load((outputs.best / "server-args.yaml").read_text())
    assert args == {"model-path": "/models/qwen", **{k: v for k, v in WINNER.flags.items() if v is not False},
                    "host": "127.0.0.1", "port": 30000}
    header = (outputs.best / "server-args.yaml").read_text()
    assert f"(candidate key {WINNER.key()})" in header and "# Environment (not a flag; export it first): " \
        "SGLANG_ENABLE_SPEC_V2=1" in header and "SIMULATED" not in header
    client = json.loads((outputs.best / "client.json").read_text())
    assert client["max_total_num_tokens"] == 100480 and client["max_request_tokens"] == 100480
    assert client["declared_context_length"] == 159776 and client["max_running_requests"] == 2
    assert "100,480 tokens fit" in (outputs.best / "client.md").read_text()


def test_launch_script_runs_the_exact_command(outputs: Outputs, tmp_path: Path) -> None:
    report = outputs.report
    assert report.fingerprint is not None
    echo = dataclasses.replace(report, fingerprint=dataclasses.replace(report.fingerprint,
                                                                        launch_command=("printf", "%s\\n")))
    script = tmp_path / "launch.sh"
    script.write_text(launch_script(echo, WINNER))
    proc = subprocess.run(["bash", str(script), "--extra"], capture_output=True, text=True, timeout=30, check=True,
                          env={**os.environ, "SGLANG_ENABLE_SPEC_V2": "0"})
    assert proc.stdout.splitlines() == [*server_argv(echo, WINNER), "--extra"]
    exposed = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=30, check=True,
                             env={**os.environ, "BIND_HOST": "0.0.0.0"}).stdout.splitlines()
    assert exposed[exposed.index("--host") + 1] == "0.0.0.0"


def test_rendering_is_idempotent(outputs: Outputs) -> None:
    before = {p: p.read_bytes() for p in [outputs.markdown, outputs.html, *sorted(outputs.best.iterdir())]}
    again = write_outputs(outputs.report.run_dir)
    assert {p: p.read_bytes() for p in before} == before
    assert again.markdown == outputs.markdown


def test_report_needs_files_only_and_survives_a_killed_study(outputs: Outputs, tmp_path: Path) -> None:
    run = tmp_path / "copy" / "killed"
    shutil.copytree(outputs.report.run_dir, run, ignore=shutil.ignore_patterns("study.db", "report.*", "best"))
    (run / "study.json").unlink()
    (run / "boots" / "0099-candidate").mkdir()          # a boot the study was killed during
    result = write_outputs(run, with_plots=False)
    report = result.report
    assert report.status.startswith("unknown") and report.incomplete_boots == ("0099-candidate",)
    assert any("0099-candidate" in w for w in report.warnings)
    assert report.noise is not None and report.noise.derived_from == "boots"
    assert report.noise.warmup_bias is not None and report.noise.warmup_bias < -0.05
    assert result.best is not None and (result.best / "launch.sh").exists()
    assert "no data to plot" in result.html.read_text()


def test_empty_run_dir_renders_without_inventing_numbers(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "empty"
    (run / "boots" / "0001-baseline").mkdir(parents=True)
    result = write_outputs(run)
    assert result.best is None
    md = result.markdown.read_text()
    assert "no winner yet" in md and "Not measured" in md and "Unknown: no successful boot" in md


def test_build_report_reads_the_ledger_beside_the_run(outputs: Outputs) -> None:
    report = build_report(outputs.report.run_dir)
    assert {e.technique for e in report.ledger if e.rejected} == {
        "hicache", "mixed-chunk", "attention-backend triton", "fused-qk-norm-rope"}
    assert len(report.boots) == 24 and len(report.ab_rows) == 4 and len(report.trials) == 2


def test_a_technique_skipped_by_the_ledger_says_so(history_template: HistoryBuilder, tmp_path: Path) -> None:
    h = copy_history(history_template, tmp_path / "skip")
    entry = h.store.ledger.rejected_for(h.fp)["hicache"]
    h.store.record_decision(DecisionRecord(study=h.run_dir.name, number=h.store.next_decision_number(),
                                           phase=Phase.SCREENING, technique="hicache",
                                           flags_delta={"enable-hierarchical-cache": True},
                                           skipped=h.store.ledger.skip_note(entry)))
    md = write_outputs(h.run_dir, with_plots=False).markdown.read_text()
    row = next(line for line in md.splitlines() if line.startswith("| hicache") and "Skipped" in line)
    assert "skipped: rejected 2026-" in row and "(study qwen-5090): crashes: AttributeError" in row
