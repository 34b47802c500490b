"""``ServerLoad``: how a study loads a ready server — its stress probes, its quality gate, its measured passes.

The booter (``tuner/flow/booter.py``) boots, checks and stops servers through the ``Runtime`` and loads them through a
``ServerLoad``; both come from the same place, so one boot procedure serves every runtime. ``HttpLoad`` sends real
requests (``traffic/loadgen.py`` for the passes and the burst, ``probes/stress.py``, ``probes/vision.py`` and
``probes/quality.py`` for the probes) to a real or an HTTP-simulated server and watches the card's memory meanwhile;
the virtual runtime's load (``tuner/flow/virtual.py``) runs the same requests on the simulator's engine in
simulated time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Protocol

from elsa_tune.errors import MeasurementFailed
from elsa_tune.probes.plan import ProbeKind, ProbeSpec
from elsa_tune.probes.protocol import ProbeBudget, ProbeResult, ProbeStatus
from elsa_tune.probes.quality import QualityGate, QualitySample
from elsa_tune.probes.stress import HealthCheck, LongContextProbe, StressProbe, burst_probe, soak_probe
from elsa_tune.probes.vision import VisionProbe
from elsa_tune.probes.watcher import MemoryWatcher
from elsa_tune.runtime.gpu import GpuView
from elsa_tune.runtime.protocol import HealthState, Server
from elsa_tune.traffic.loadgen import LoadGenerator, LoadgenSettings, Timeouts
from elsa_tune.traffic.measurement import RunMeasurement
from elsa_tune.traffic.prompts import PromptSynth
from elsa_tune.traffic.workload import Workload
from elsa_tune.tuner.ab.boot_sample import PassMeasurement

QUALITY = "quality"


@dataclass(frozen=True)
class QualityCheck:
    """The quality gate on one boot: its result and, when no reference was given, the sample recorded as one."""

    result: ProbeResult
    reference: QualitySample | None = None


@dataclass(frozen=True)
class Passes:
    """The warm-up and measured passes of one boot, in order, with each pass's summary for the boot record.

    ``stopped`` is why a pass failed (the passes stop there; the booter asks the runtime whether the server died),
    with its ``remedy``; ``min_free_bytes`` the least free GPU memory seen while they ran.
    """

    passes: tuple[PassMeasurement, ...]
    summaries: tuple[dict[str, Any], ...]
    min_free_bytes: int | None = None
    stopped: str | None = None
    remedy: str = ""


class ServerLoad(Protocol):
    """Loads ready servers of one runtime. Nothing raises for a failing candidate: a probe that kills the server is
    a ``FAILED`` result, a pass that fails stops the passes (``Passes.stopped``)."""

    def now(self) -> float:
        """Unix seconds in the servers' time (the simulated system's for a virtual runtime)."""
        ...

    def probe(self, server: Server, spec: ProbeSpec, budget: ProbeBudget) -> ProbeResult:
        """Run one stress probe (``probes/plan.py``) on ``server``."""
        ...

    def quality(self, server: Server, budget: ProbeBudget, reference: QualitySample | None) -> QualityCheck:
        """The quality gate against ``reference``, or, without one, the sample that becomes the reference."""
        ...

    def passes(self, server: Server, workload: Workload, *, warmup: int, measured: int,
               budget: ProbeBudget) -> Passes:
        """``warmup`` then ``measured`` passes of ``workload`` on ``server``."""
        ...


class HttpLoad:
    """The ``ServerLoad`` of a server that answers HTTP: real requests, wall-clock time, the card's memory watched."""

    def __init__(self, check: HealthCheck, gpu: GpuView | None, prompts: PromptSynth, *, seed: int = 0,
                 gate: QualityGate | None = None) -> None:
        self.check = check
        self.gpu = gpu
        self.prompts = prompts
        self.seed = seed
        self.gate = gate or QualityGate()

    def now(self) -> float:
        return time.time()

    def probe(self, server: Server, spec: ProbeSpec, budget: ProbeBudget) -> ProbeResult:
        return self._probe(spec).run(server, self._budget(spec, budget))

    def _probe(self, spec: ProbeSpec) -> StressProbe:
        if spec.kind is ProbeKind.LONG_CONTEXT or spec.kind is ProbeKind.LONG_CONTEXT_CONCURRENT:
            return LongContextProbe(self.check, self.gpu, target_tokens=spec.target_tokens, seed=self.seed,
                                    concurrent=spec.kind is ProbeKind.LONG_CONTEXT_CONCURRENT,
                                    concurrent_output_tokens=spec.output_tokens or 1, check_needles=spec.check_needles)
        if spec.kind is ProbeKind.VISION:
            return VisionProbe(self.check, self.gpu, target_tokens=spec.target_tokens)
        assert spec.workload is not None, f"a {spec.name} probe needs its workload"
        if spec.kind is ProbeKind.BURST:
            return burst_probe(self.check, self.gpu, spec.workload, self.prompts)
        return soak_probe(self.check, self.gpu, spec.workload, self.prompts, spec.seconds)

    @staticmethod
    def _budget(spec: ProbeSpec, budget: ProbeBudget) -> ProbeBudget:
        if spec.kind is ProbeKind.SOAK:
            return replace(budget, deadline_s=spec.seconds + budget.request_timeout_s)
        return budget

    def quality(self, server: Server, budget: ProbeBudget, reference: QualitySample | None) -> QualityCheck:
        if reference is not None:
            return QualityCheck(self.gate.run(server, budget, reference))
        started = time.monotonic()
        sample = self.gate.sample(server, budget)
        seconds = time.monotonic() - started
        if sample.errors and self.check(server).state is HealthState.DEAD:
            return QualityCheck(ProbeResult(QUALITY, ProbeStatus.FAILED, "the server died answering the quality "
                                            "reference's questions", seconds=seconds, evidence=sample.errors[:5]))
        return QualityCheck(ProbeResult(QUALITY, ProbeStatus.PASSED, "quality reference recorded", seconds=seconds),
                            sample)

    def passes(self, server: Server, workload: Workload, *, warmup: int, measured: int,
               budget: ProbeBudget) -> Passes:
        settings = LoadgenSettings(timeouts=Timeouts(first_token_s=budget.request_timeout_s, stall_s=budget.hang_s,
                                                     run_s=budget.deadline_s))
        gen = LoadGenerator(server.base_url, self.prompts, slots=server.report.max_running_requests,
                            settings=settings)
        watcher = MemoryWatcher(self.gpu) if self.gpu is not None else None
        if watcher is not None:
            watcher.start()
        passes: list[PassMeasurement] = []
        summaries: list[dict[str, Any]] = []
        stopped: MeasurementFailed | None = None
        try:
            for i in range(warmup + measured):
                try:
                    m = gen.measure(workload, i)
                except MeasurementFailed as exc:
                    stopped = exc
                    break
                passes.append(_pass(m, i < warmup))
                summaries.append(_summary(m, i < warmup))
        finally:
            headroom = watcher.stop() if watcher is not None else None
        return Passes(tuple(passes), tuple(summaries), headroom.min_free_bytes if headroom is not None else None,
                      stopped.message if stopped is not None else None, stopped.remedy if stopped is not None else "")


def _pass(m: RunMeasurement, warm: bool) -> PassMeasurement:
    total = max(1, m.requests_total)
    return PassMeasurement(output_throughput_tok_s=m.output_throughput_tok_s, ttft_p50_s=m.ttft_s.p50,
                           ttft_p99_s=m.ttft_s.p99, warmup=warm, error_fraction=m.errors.count / total,
                           duration_s=m.window_s, ttft_p90_s=m.ttft_s.p90, requests_ok=m.requests_ok)


def _summary(m: RunMeasurement, warm: bool) -> dict[str, Any]:
    return {"workload_id": m.workload_id, "pass_index": m.pass_index, "warmup": warm,
            "output_throughput_tok_s": m.output_throughput_tok_s, "requests_total": m.requests_total,
            "requests_ok": m.requests_ok, "errors": m.errors.count, "window_s": m.window_s,
            "simulated_time": m.simulated,
            "ttft_s": {"p50": m.ttft_s.p50, "p99": m.ttft_s.p99}, "max_concurrency": m.max_concurrency,
            "slots": m.slots, "above_slots": m.above_slots, "cached_token_ratio": m.cached_token_ratio}
