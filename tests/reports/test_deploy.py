"""``best/`` in SGLang's own terms: rounding of drawn floats, the SIMULATED stamp, the image choice, the bind
address, and the client warning when the server advertises more context than its KV pool holds."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest
import yaml
from elsa_history_factory import WINNER, HistoryBuilder, copy_history

from elsa_tune.reports.deploy import SIMULATED, build_bundle, client_text, deployable, image_of
from elsa_tune.reports.model import Report, build_report


@pytest.fixture(scope="module")
def report(history_template: HistoryBuilder, tmp_path_factory: pytest.TempPathFactory) -> Report:
    return build_report(copy_history(history_template, tmp_path_factory.mktemp("deploy")).run_dir)


def _with(report: Report, *, runtime: str | None = None, incumbent_flags: dict[str, object] | None = None,
          image_digest: str | None = None, runtime_version: str | None = None) -> Report:
    assert report.fingerprint is not None and report.study is not None
    fp = dataclasses.replace(report.fingerprint, runtime=runtime or report.fingerprint.runtime,
                             image_digest=image_digest, runtime_version=runtime_version)
    incumbent = report.study.incumbent.merged(flags=incumbent_flags) if incumbent_flags else report.study.incumbent
    study = dataclasses.replace(report.study, fingerprint=fp, incumbent=incumbent, image=None)
    return dataclasses.replace(report, fingerprint=fp, study=study)


def test_a_drawn_float_is_written_as_a_person_would_type_it(report: Report, tmp_path: Path) -> None:
    drawn = _with(report, incumbent_flags={"mamba-full-memory-ratio": 1.8000227980835264,
                                           "mem-fraction-static": 0.9300000000000001})
    bundle = build_bundle(drawn)
    assert bundle is not None
    assert bundle.candidate.flags["mamba-full-memory-ratio"] == 1.8
    assert bundle.candidate.flags["mem-fraction-static"] == 0.93
    assert "1.8000227980835264" not in bundle.compose_yaml.split("\n# Rounded", 1)[0]
    assert "--mamba-full-memory-ratio 1.8 " in bundle.launch_sh.replace(" \\\n", " ")
    assert "# Rounded for deployment: --mamba-full-memory-ratio 1.8000227980835264 → 1.8" in bundle.launch_sh
    assert yaml.safe_load(bundle.server_args_yaml)["mamba-full-memory-ratio"] == 1.8
    assert deployable(WINNER) == WINNER                  # values on a step are unchanged


def test_a_simulated_study_is_stamped_in_every_file(report: Report, tmp_path: Path) -> None:
    bundle = build_bundle(_with(report, runtime="sglang-sim"))
    assert bundle is not None
    for name, (content, _) in bundle.files().items():
        if name != "client.json":
            assert SIMULATED in content.splitlines()[1 if name == "launch.sh" else 0], name
    assert '"simulated": true' in bundle.client_json
    script = tmp_path / "launch.sh"
    script.write_text(bundle.launch_sh.replace("exec ", "exec true ", 1))
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=30, check=True)
    assert SIMULATED in proc.stderr
    assert SIMULATED not in (build_bundle(report) or bundle).launch_sh


def test_the_image_is_pinned_by_digest_when_the_runtime_reported_one(report: Report) -> None:
    assert image_of(_with(report, image_digest="lmsysorg/sglang@sha256:abc"))[0] == "lmsysorg/sglang@sha256:abc"
    assert image_of(_with(report, runtime_version="0.5.23"))[0] == "lmsysorg/sglang:v0.5.23"
    image, why = image_of(_with(report))
    assert image == "lmsysorg/sglang:latest" and "pin" in why


def test_client_md_warns_when_context_len_exceeds_the_kv_pool(report: Report) -> None:
    assert report.client is not None
    undeclared = dataclasses.replace(report.client, declared_context_length=None, context_len=262144,
                                     max_total_num_tokens=82592)
    text = client_text(dataclasses.replace(report, client=undeclared))
    assert "Largest request (prompt + output): 82,592 tokens.** The server reports `context_len` 262,144" in text
    fits = dataclasses.replace(undeclared, context_len=65536)
    assert "reports `context_len`" not in client_text(dataclasses.replace(report, client=fits))
