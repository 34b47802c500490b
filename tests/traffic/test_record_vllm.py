"""``elsa-tune record --runtime vllm`` against a real Prometheus holding six backfilled hours of vLLM's series.

vLLM's prompt counter counts the tokens served from the prefix cache too, so they are not added twice; the
cached-token counter is backfilled under its name before vLLM 0.10 (``vllm:gpu_prefix_cache_hits_total``) and is
read under it, with a note.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from llamacpp_backfill import HIT_RATE, LlamaTruth

from elsa_tune.runtime.vllm.family import VLLM
from elsa_tune.traffic.prometheus import PrometheusClient
from elsa_tune.traffic.recording import RecordWindow
from elsa_tune.traffic.token_recording import GivenLengths, record_tokens
from elsa_tune.tuner.cli import main


def _iso(stamp: float) -> str:
    return datetime.fromtimestamp(stamp, UTC).isoformat()


def test_prompt_tokens_are_not_counted_twice_and_the_old_name_is_read(vllm_hours: tuple[str, LlamaTruth]) -> None:
    url, truth = vllm_hours
    window = RecordWindow(start=truth.start, end=truth.end, step=truth.scrape_s, selector='{job="llama"}')
    with PrometheusClient(url) as client:
        recording = record_tokens(client, window, VLLM.metrics, GivenLengths(truth.prompt_mean, truth.output_mean),
                                  runtime="vllm", seed=4)
    report = recording.report
    assert report.prompt_tokens == (truth.processed + truth.cached).sum()
    assert report.cached_prompt_tokens == truth.cached.sum()
    assert report.generation_tokens == truth.generated.sum()
    assert report.prefix_hit_rate_observed == pytest.approx(HIT_RATE, abs=0.002)
    assert report.draft_acceptance == pytest.approx(truth.accepted.sum() / truth.drafted.sum())
    assert any("vllm:gpu_prefix_cache_hits_total" in note for note in report.notes)


def test_cli_records_vllm(vllm_hours: tuple[str, LlamaTruth], tmp_path: Path,
                          capsys: pytest.CaptureFixture[str]) -> None:
    url, truth = vllm_hours
    out = tmp_path / "vllm.parquet"
    code = main(["record", "--prometheus", url, "--start", _iso(truth.start), "--end", _iso(truth.end),
                 "--selector", '{job="llama"}', "--step", f"{truth.scrape_s:g}s", "--runtime", "vllm",
                 "--mean-input-tokens", "700", "--mean-output-tokens", "200", "-o", str(out)])
    assert code == 0 and out.exists()
    printed = capsys.readouterr().out
    assert "vllm's series" in printed and "vllm:generation_tokens_total" in printed
    assert main(["record", "--prometheus", url, "--start", _iso(truth.start), "--end", _iso(truth.end),
                 "--runtime", "vllm", "-o", str(tmp_path / "t.parquet")]) == 2
    assert VLLM.metrics.missing in capsys.readouterr().err
