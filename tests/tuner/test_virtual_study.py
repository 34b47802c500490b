"""Virtual-time studies: the real study on ``VirtualSGLang`` under a simulated clock (``tuner/flow/virtual.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from elsa_tune.history.records import BootOutcome, Phase
from elsa_tune.history.run_dir import RunDir
from elsa_tune.history.store import StudyStore
from elsa_tune.probes.protocol import ProbeStatus
from elsa_tune.runtime.failure import FailureKind
from elsa_tune.runtime.sim.profile import load_profile
from elsa_tune.runtime.sim.virtual import VirtualSGLang
from elsa_tune.search_spaces.candidate import Candidate
from elsa_tune.tuner.cli import main
from elsa_tune.tuner.flow.booter import BootPlan, CandidateBooter
from elsa_tune.tuner.flow.preflight import run_preflight
from elsa_tune.tuner.flow.settings import Settings
from elsa_tune.tuner.flow.virtual import VirtualBench, VirtualTestbed, run_virtual_study

REPO = Path(__file__).resolve().parents[2]
TINY_SPACE = REPO / "benchmarks" / "workers" / "tiny-space.yaml"
TINY = {"mem-fraction-static": 0.6, "max-running-requests": 2, "max-mamba-cache-size": 24,
        "speculative-algorithm": "EAGLE", "speculative-eagle-topk": 1, "speculative-num-steps": 2,
        "speculative-num-draft-tokens": 3}


def test_a_virtual_launch_is_read_by_the_real_log_parser_and_classifier() -> None:
    runtime = VirtualSGLang("tiny-test")
    ok = runtime.launch(Candidate(flags=TINY))
    assert ok.failure is None and ok.report is not None
    assert ok.report.max_total_num_tokens and ok.report.max_running_requests == 2
    assert "The server is fired up and ready to roll!" in ok.log_text
    assert ok.boot_s > 20
    crash = runtime.launch(Candidate(flags={**TINY, "enable-hierarchical-cache": True}))
    assert crash.failure is not None and crash.failure.kind is FailureKind.TECHNIQUE_CRASH
    assert "layer_num" in crash.log_text
    ignored = runtime.launch(Candidate(flags={**TINY, "enable-mixed-chunk": True}))
    assert ignored.report is not None
    assert [a.flag for a in ignored.report.adjustments] == ["enable-mixed-chunk"]
    bad = runtime.launch(Candidate(flags={**TINY, "no-such-flag": 3}))
    assert bad.failure is not None and bad.failure.kind is FailureKind.BAD_FLAG


def test_serving_crashes_are_classified_from_sglang_lines() -> None:
    bench = VirtualBench(profile="tiny-test", space=str(TINY_SPACE), budget_s=3600)
    oom = bench.boot(Candidate(flags={**TINY, "speculative-algorithm": "NGRAM"}), 0)
    assert oom.failed is not None and oom.failed.kind is FailureKind.OOM_UNDER_LOAD
    hang = bench.boot(Candidate(flags={**TINY, "max-mamba-cache-size": 64, "max-running-requests": 1}), 1)
    assert hang.failed is not None and hang.failed.kind is FailureKind.HANG


def test_boot_noise_follows_the_profile_and_the_boot_seed() -> None:
    bench = VirtualBench(profile="tiny-test", space=str(TINY_SPACE), budget_s=3600)
    candidate = Candidate(flags=TINY)
    truth = bench.truth(candidate)
    assert truth is not None and truth.output_tokens_per_s
    first = [bench.boot(candidate, i) for i in range(12)]
    again = [bench.boot(candidate, i) for i in range(12)]
    means = [s.measured[0].output_throughput_tok_s for s in first]
    assert means == [s.measured[0].output_throughput_tok_s for s in again]     # a boot's seed fixes its draw
    assert len(set(means)) == 12                                               # boots differ
    ratio = sorted(m / truth.output_tokens_per_s for m in means)[6]
    assert 0.8 < ratio < 1.2                                                   # around the truth
    # the clock moved by the 12 boots (each a launch and three passes); the 12 repeated tags were read back
    assert 12 * 3 * truth.makespan_s * 0.5 < bench.clock.now() < 12 * (3 * truth.makespan_s * 2 + 60)


def test_a_whole_virtual_study_spends_simulated_time(tmp_path: Path) -> None:
    result = run_virtual_study(profile="tiny-test", space=str(TINY_SPACE), out=tmp_path / "study",
                               budget_s=3600, seed=3)
    assert result.status == "finished"
    assert 0.8 * 3600 <= result.sim_seconds <= 1.1 * 3600
    history = RunDir(result.run_dir).load()
    assert len(history.boots) == result.boots > 10
    assert {b.fingerprint.runtime for b in history.boots} == {"sglang-sim-virtual"}
    assert sum(b.seconds for b in history.boots) == pytest.approx(result.sim_seconds, rel=0.05)
    measured = [b for b in history.boots if b.outcome is BootOutcome.MEASURED]
    assert measured and all((result.run_dir / (b.log_path or "")).read_text().strip() for b in measured)
    assert (result.run_dir / "report.md").exists()


def test_the_cli_runs_a_virtual_what_if(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "what-if"
    code = main(["--gpu", "sim", "--virtual", "--sim-profile", "tiny-test", "--space", str(TINY_SPACE),
                 "--traffic", "demo", "--budget", "30m", "--out", str(out), "--no-live"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "simulated hours" in printed and "not a measurement of real hardware" in printed
    study = RunDir(out).read_study()
    assert study is not None and study.settings["virtual"] is True


VISION_PROFILE = "rtx5090-qwen3.6-35b-a3b-nvfp4"
VISION_SPACE = "qwen3.6-35b-a3b-nvfp4-rtx5090"


def test_a_vision_models_study_runs_the_vision_probe(tmp_path: Path) -> None:
    result = run_virtual_study(profile=VISION_PROFILE, space=VISION_SPACE, out=tmp_path / "study", budget_s=3600,
                               seed=1)
    probed = [b for b in RunDir(result.run_dir).load().boots if b.probes]
    names = [[p.name for p in b.probes] for b in probed]
    assert ["long_context", "long_context_concurrent", "burst", "vision", "quality"] in names
    # every probed boot that survived the probes before it ran the vision probe
    for boot in probed:
        before = [p for p in boot.probes if p.name in ("long_context", "long_context_concurrent", "burst")]
        if len(before) == 3 and all(p.status is ProbeStatus.PASSED for p in before):
            assert [p.name for p in boot.probes][3] == "vision"


def test_a_config_without_room_for_a_maximum_size_image_fails_the_vision_probe(tmp_path: Path) -> None:
    """Text traffic runs at a static fraction that leaves ~840 MiB free (above the 512 MiB floor); the vision
    encoder's temporaries for the largest image (0.95 GiB, outside the pools) do not fit, and only the vision probe
    sees it. The same configuration at 0.88 leaves room and passes."""
    settings = Settings(gpu="sim", runtime="sim", virtual=True, sim_profile=VISION_PROFILE, space=VISION_SPACE,
                        traffic="demo", live=False, out=tmp_path / "out")
    bed = VirtualTestbed.of(run_preflight(settings))
    assert bed.pre.space.model.vision
    store = StudyStore(tmp_path / "run", name="vision", heartbeat_interval=None)
    booter = CandidateBooter(bed.pre.boot_context(store, "vision"), load=bed.load)
    config = load_profile(VISION_PROFILE).config("elsa-1.7")
    text = {k: v for k, v in config.flags.items() if not k.startswith("speculative")}
    records = {}
    for fraction in (0.88, 0.94):
        plan = BootPlan(tag=f"screening:static-{fraction}:probe", phase=Phase.SCREENING, probes=True,
                        candidate=Candidate({**text, "mem-fraction-static": fraction}, env=dict(config.env)))
        records[fraction] = booter.boot(plan).record
    fits, short = records[0.88], records[0.94]
    assert fits.outcome is BootOutcome.MEASURED
    assert [(p.name, p.status) for p in fits.probes][3] == ("vision", ProbeStatus.PASSED)
    assert short.outcome is BootOutcome.PROBE_FAILED
    assert [(p.name, p.status) for p in short.probes] == [
        ("long_context", ProbeStatus.PASSED), ("long_context_concurrent", ProbeStatus.PASSED),
        ("burst", ProbeStatus.PASSED), ("vision", ProbeStatus.FAILED)]
    assert short.failure is not None and short.failure.kind is FailureKind.OOM_UNDER_LOAD
    assert any("vision encoder" in line for line in short.failure.evidence)
