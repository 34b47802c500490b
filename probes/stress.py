"""OOM-safe stress probes, run on every candidate's first boot before anything is measured.

- ``LongContextProbe``: one prompt as long as the study's context target allows (never more than the
  ``max_total_num_tokens`` the server really reported: ``--context-length`` only declares) with needles at several
  depths.
- ``LongContextProbe(concurrent=True)``: the same, next to long sampled generations filling the other
  running slots (a 200K prompt beside seven long generations fails memory fractions that benchmarks pass).
- ``BurstProbe``: the busiest window of the traffic at the slot limit, through the load generator.
- ``SoakProbe``: mixed traffic for a configured duration (final confirmation).

Each probe (a ``StressProbe``) watches GPU memory while it runs and classifies what went wrong with the
runtime layer's failure classes: a dead server is classified from its log (after a bounded wait for a dying
one to be seen dead), a stream with no token for ``hang_s`` seconds is a hang even while ``/health``
answers, a survivor below the headroom floor is ``LOW_HEADROOM``, and the retractions the server logged
meanwhile are recorded. Every wait is bounded by the probe budget. ``vision.py`` adds the image probe and
``plan.py`` lists the probes a boot runs.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from elsa_tune.errors import MeasurementFailed
from elsa_tune.probes import haystack
from elsa_tune.probes.client import ChatRequest, ProbeClient, Reply
from elsa_tune.probes.protocol import ProbeBudget, ProbeResult, ProbeStatus
from elsa_tune.probes.watcher import HeadroomSummary, MemoryWatcher
from elsa_tune.runtime.failure import Failure, FailureKind
from elsa_tune.runtime.gpu import GpuView
from elsa_tune.runtime.protocol import Health, HealthState, Server
from elsa_tune.traffic.loadgen import LoadGenerator, LoadgenSettings, Timeouts
from elsa_tune.traffic.prompts import PromptSynth
from elsa_tune.traffic.workload import Workload

log = logging.getLogger(__name__)

HealthCheck = Callable[[Server], Health]
CALIBRATION_WORDS = 200
#: room left for the chat template, the question and the answer when sizing a prompt to the pool
TEMPLATE_SLACK_TOKENS = 256
#: how long a failed probe waits for a dying server to be seen dead before classifying what it saw
DEATH_WAIT_S = 5.0


@dataclass(frozen=True)
class Outcome:
    """What a probe's body found, before the headroom floor and the server's health are applied."""

    status: ProbeStatus
    detail: str
    failure: Failure | None = None
    evidence: tuple[str, ...] = ()
    metrics: dict[str, object] | None = None


class StressProbe:
    """A probe that loads the server while a ``MemoryWatcher`` samples the card: subclasses write ``_body``;
    ``run`` bounds it by the budget's deadline, classifies failures from the server's health and log, and
    turns a survivor below the headroom floor into ``LOW_HEADROOM``."""

    name = "probe"

    def __init__(self, check: HealthCheck, gpu: GpuView | None) -> None:
        self._check = check
        self._gpu = gpu

    def run(self, server: Server, budget: ProbeBudget) -> ProbeResult:
        started = time.monotonic()
        log_start = _log_size(server)
        watcher = MemoryWatcher(self._gpu) if self._gpu is not None else None
        if watcher is not None:
            watcher.start()
        try:
            outcome = asyncio.run(self._bounded(server, budget))
        finally:
            headroom = watcher.stop() if watcher is not None else None
        outcome = self._after(server, outcome, headroom, budget)
        metrics = dict(outcome.metrics or {})
        evidence = outcome.evidence
        retracted, lines = retractions(server.log_path, log_start)
        if lines:
            # the pool ran out and requests were pushed back: survivable, but memory pressure worth recording
            metrics["retracted_requests"] = retracted
            evidence = (*evidence, *lines[:3])
        return ProbeResult(name=self.name, status=outcome.status, detail=outcome.detail, failure=outcome.failure,
                           min_free_bytes=headroom.min_free_bytes if headroom else None,
                           seconds=time.monotonic() - started, metrics=metrics, evidence=evidence)

    async def _bounded(self, server: Server, budget: ProbeBudget) -> Outcome:
        try:
            async with asyncio.timeout(budget.deadline_s):
                return await self._body(server, budget)
        except TimeoutError:
            return Outcome(ProbeStatus.FAILED, f"the probe did not finish within {budget.deadline_s:g} s",
                            Failure(FailureKind.HANG, f"{self.name} exceeded its {budget.deadline_s:g} s deadline",
                                    "lower the load or raise probes.deadline_s if the card is simply slow",
                                    phase="serve"))

    async def _body(self, server: Server, budget: ProbeBudget) -> Outcome:
        raise NotImplementedError

    def _settled_health(self, server: Server) -> Health:
        """The server's health once a crash had time to show: a scheduler that died mid-stream takes a moment
        to take its process tree down, so an alive answer is re-checked for ``DEATH_WAIT_S`` (bounded)."""
        deadline = time.monotonic() + DEATH_WAIT_S
        health = self._check(server)
        while health.state is not HealthState.DEAD and time.monotonic() < deadline:
            time.sleep(0.2)
            health = self._check(server)
        return health

    def _after(self, server: Server, outcome: Outcome, headroom: HeadroomSummary | None,
               budget: ProbeBudget) -> Outcome:
        """Turn request errors into a classified failure; apply the headroom floor to survivors."""
        if outcome.status is ProbeStatus.FAILED and outcome.failure is None:
            health = self._settled_health(server)
            if health.state is HealthState.UNHEALTHY and health.failure is not None:
                return Outcome(ProbeStatus.FAILED, f"{outcome.detail}; {health.failure.summary}", health.failure,
                                outcome.evidence + health.failure.evidence, outcome.metrics)
            if health.state is HealthState.DEAD and health.failure is not None:
                return Outcome(ProbeStatus.FAILED, f"{outcome.detail}; the server died: {health.failure.summary}",
                                health.failure, outcome.evidence + health.failure.evidence, outcome.metrics)
            if health.state is HealthState.DEAD:
                return Outcome(ProbeStatus.FAILED, f"{outcome.detail}; the server died ({health.detail})",
                                Failure(FailureKind.UNKNOWN_CRASH, health.detail,
                                        "read the server log in the boot folder", phase="serve"),
                                outcome.evidence, outcome.metrics)
        if outcome.failure is not None and outcome.failure.kind is FailureKind.HANG:
            health = self._check(server)
            seen = f"while the server stayed up: {health.detail}" if health.state is not HealthState.DEAD else \
                f"the server is gone: {health.detail}"
            return Outcome(outcome.status, f"{outcome.detail} ({seen})", outcome.failure,
                           (*outcome.evidence, f"health after the hang: {health.state.value}, {health.detail}"),
                           outcome.metrics)
        if outcome.status is ProbeStatus.PASSED and headroom is not None:
            below = headroom.below(budget.headroom_floor_bytes)
            if below:
                mib = (headroom.min_free_bytes or 0) / 2**20
                return Outcome(ProbeStatus.LOW_HEADROOM,
                                f"survived with {mib:.0f} MiB free, below the floor of "
                                f"{budget.headroom_floor_bytes / 2**20:.0f} MiB",
                                None, outcome.evidence, outcome.metrics)
        return outcome


_RETRACTED = re.compile(r"Retract requests\. #retracted_reqs: (\d+)")


def _log_size(server: Server) -> int:
    try:
        return server.log_path.stat().st_size
    except OSError:
        return 0


def retractions(log_path: Path, start: int = 0) -> tuple[int, tuple[str, ...]]:
    """SGLang's retraction lines (``KV cache pool is full. Retract requests. #retracted_reqs: N``) a server
    logged since byte ``start``: the requests retracted and the lines themselves."""
    try:
        with log_path.open("rb") as f:
            f.seek(start)
            text = f.read(64 * 1024 * 1024).decode(errors="replace")
    except OSError:
        return 0, ()
    lines = tuple(line.strip() for line in text.splitlines() if _RETRACTED.search(line))
    return sum(int(m.group(1)) for line in lines if (m := _RETRACTED.search(line))), lines


def prompt_budget(server: Server, target_tokens: int) -> int:
    """``target_tokens`` capped by the pool and context length the server really reported, not the declared one."""
    report = server.report
    limits = [target_tokens]
    if report.max_total_num_tokens:
        limits.append(report.max_total_num_tokens - TEMPLATE_SLACK_TOKENS)
    if report.context_len:
        limits.append(report.context_len - TEMPLATE_SLACK_TOKENS)
    return max(0, min(limits))


def classify_replies(replies: Sequence[Reply], hang_s: float) -> Outcome | None:
    hung = [r for r in replies if r.hung]
    if hung:
        return Outcome(ProbeStatus.FAILED, f"{len(hung)} of {len(replies)} requests hung",
                        Failure(FailureKind.HANG, f"no token for {hang_s:g} s while the server stayed up",
                                "the runtime stalls under this load: lower max-running-requests or chunked "
                                "prefill, or check the watchdog", evidence=tuple(r.error for r in hung[:3]),
                                phase="serve"))
    failed = [r for r in replies if not r.ok]
    if failed:
        return Outcome(ProbeStatus.FAILED, f"{len(failed)} of {len(replies)} requests failed: {failed[0].error}",
                        evidence=tuple(r.error[:300] for r in failed[:3]))
    return None


class LongContextProbe(StressProbe):
    """A needle-in-a-haystack prompt sized to ``min(target_tokens, reported pool)``. ``check_needles=False`` (a model
    that does not retrieve) checks that every question over the prompt is served, not what it answers.

    With ``concurrent=True`` the remaining running slots are filled with long sampled generations of
    ``concurrent_output_tokens`` each while the long prompt is answered.
    """

    def __init__(self, check: HealthCheck, gpu: GpuView | None, *, target_tokens: int,
                 concurrent: bool = False, concurrent_output_tokens: int = 2048, seed: int = 0,
                 depths: Sequence[float] = (0.1, 0.5, 0.9), check_needles: bool = True) -> None:
        super().__init__(check, gpu)
        self.check_needles = check_needles
        self.name = "long_context_concurrent" if concurrent else "long_context"
        self.target_tokens = target_tokens
        self.concurrent = concurrent
        self.concurrent_output_tokens = concurrent_output_tokens
        self.seed = seed
        self.depths = tuple(depths)

    def prompt_tokens(self, server: Server) -> int:
        """The prompt length actually sent: the target, capped by what the server reports it can hold."""
        return prompt_budget(server, self.target_tokens)

    async def _body(self, server: Server, budget: ProbeBudget) -> Outcome:
        client = ProbeClient(server.base_url, first_token_s=budget.request_timeout_s, hang_s=budget.hang_s)
        tokens = self.prompt_tokens(server)
        if tokens < 64:
            return Outcome(ProbeStatus.FAILED, f"the server can hold only {tokens} prompt tokens",
                            Failure(FailureKind.NO_ROOM_FOR_KV, "the KV pool is too small for any long prompt",
                                    "raise mem-fraction-static or lower the draft/mamba reservations",
                                    phase="serve"))
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        async with httpx.AsyncClient(limits=limits, trust_env=False) as http:
            # two sizes: tokens per filler word (the slope) apart from the template and question (the intercept)
            points: list[tuple[int, int]] = []
            for size in (CALIBRATION_WORDS // 4, CALIBRATION_WORDS * 4):
                calibration = haystack.build(size, depths=(0.5,), seed=self.seed)
                probe = await client.chat(http, _ask(calibration, calibration.needles[0], max_tokens=1))
                bad = classify_replies([probe], budget.hang_s)
                if bad is not None:
                    return Outcome(bad.status, f"calibration request: {bad.detail}", bad.failure, bad.evidence)
                if not probe.prompt_tokens:
                    return Outcome(ProbeStatus.FAILED, "the server reports no usage.prompt_tokens; the probe cannot "
                                   "size its prompt", evidence=(f"reply: {probe.text[:80]!r}",))
                points.append((calibration.words, probe.prompt_tokens))
            (w0, t0), (w1, t1) = points
            per_word = max(0.1, (t1 - t0) / max(1, w1 - w0))
            words = max(60, int(w0 + (tokens - t0) / per_word * 0.99))
            hay = haystack.build(words, depths=self.depths, seed=self.seed)
            background: list[asyncio.Task[Reply]] = []
            slots = server.report.max_running_requests or 1
            if self.concurrent and slots > 1:
                background = [asyncio.create_task(client.chat(http, ChatRequest(
                    messages=[{"role": "user", "content": f"Write a long story about lighthouse {i}."}],
                    max_tokens=self.concurrent_output_tokens, temperature=0.8, ignore_eos=True)))
                    for i in range(slots - 1)]
            try:
                replies: list[Reply] = []
                for needle in hay.needles:
                    replies.append(await client.chat(http, _ask(hay, needle, max_tokens=32)))
                    if not replies[-1].ok:
                        break      # a hung or dead server answers the next needles no better
                replies_bg: list[Reply] = []
                if replies[-1].ok:
                    replies_bg = list(await asyncio.gather(*background))
            finally:
                for task in background:
                    task.cancel()
        metrics: dict[str, object] = {"prompt_tokens": replies[0].prompt_tokens, "target_tokens": self.target_tokens,
                                      "sent_tokens_estimate": tokens, "concurrent_generations": len(background)}
        bad = classify_replies(replies + replies_bg, budget.hang_s)
        if bad is not None:
            return Outcome(bad.status, bad.detail, bad.failure, bad.evidence, metrics)
        missed = [n for n, r in zip(hay.needles, replies, strict=True) if not n.found_in(r.text)]
        metrics["needles_found"] = len(hay.needles) - len(missed)
        if not self.check_needles:
            return Outcome(ProbeStatus.PASSED, f"{len(hay.needles)} questions answered over "
                           f"{replies[0].prompt_tokens or tokens:,} tokens (answers not checked: the model does not "
                           "retrieve)" + (f" beside {len(background)} long generations" if background else ""),
                           metrics=metrics)
        if missed:
            return Outcome(ProbeStatus.REGRESSED,
                            f"{len(missed)} of {len(hay.needles)} needles not retrieved (depths "
                            f"{', '.join(f'{n.depth:.0%}' for n in missed)})",
                            evidence=tuple(f"asked for {n.name}: answered {r.text[:80]!r}"
                                           for n, r in zip(hay.needles, replies, strict=True) if n in missed),
                            metrics=metrics)
        return Outcome(ProbeStatus.PASSED, f"{len(hay.needles)} needles retrieved from "
                        f"{replies[0].prompt_tokens or tokens:,} tokens" +
                        (f" beside {len(background)} long generations" if background else ""), metrics=metrics)


def _ask(hay: haystack.Haystack, needle: haystack.Needle, *, max_tokens: int) -> ChatRequest:
    return ChatRequest(messages=[{"role": "user", "content": f"{hay.text}\n\n{needle.question}"}],
                       max_tokens=max_tokens, temperature=0.0)


class LoadProbe(StressProbe):
    """Replays a workload through the load generator and fails on crashes, hangs or mostly-failed runs.

    ``BurstProbe`` and ``SoakProbe`` are this probe with the busiest window or a long mixed workload.
    """

    def __init__(self, check: HealthCheck, gpu: GpuView | None, *, name: str, workload: Workload,
                 prompts: PromptSynth, repeat_until_s: float | None = None) -> None:
        super().__init__(check, gpu)
        self.name = name
        self.workload = workload
        self.prompts = prompts
        self.repeat_until_s = repeat_until_s

    async def _body(self, server: Server, budget: ProbeBudget) -> Outcome:
        timeouts = Timeouts(first_token_s=budget.request_timeout_s, stall_s=budget.hang_s,
                            run_s=budget.deadline_s)
        gen = LoadGenerator(server.base_url, self.prompts, slots=server.report.max_running_requests,
                            settings=LoadgenSettings(timeouts=timeouts))
        passes = 0
        deadline = time.monotonic() + (self.repeat_until_s or 0.0)
        metrics: dict[str, object] = {}
        while True:
            try:
                run = await gen.run(self.workload, pass_index=passes)
            except MeasurementFailed as exc:
                return Outcome(ProbeStatus.FAILED, f"pass {passes}: {exc.message}", evidence=(exc.message,),
                                metrics=metrics)
            passes += 1
            metrics = {"passes": passes, "requests": len(run.records), "errors": run.errors.count,
                       "output_throughput_tok_s": run.output_throughput_tok_s}
            timeouts_seen = [r for r in run.records if r.timeout_phase == "stall"]
            if timeouts_seen:
                return Outcome(ProbeStatus.FAILED, f"{len(timeouts_seen)} streams stalled for {budget.hang_s:g} s",
                                Failure(FailureKind.HANG, "streams stopped while the server stayed up",
                                        "the runtime stalls under burst load: lower max-running-requests",
                                        phase="serve"), metrics=metrics)
            if run.errors.count:
                health = self._check(server)
                if health.state is HealthState.DEAD:
                    return Outcome(ProbeStatus.FAILED, f"{run.errors.count} requests failed and the server died",
                                    metrics=metrics)
            if self.repeat_until_s is None or time.monotonic() >= deadline:
                break
        if run.errors.count:
            return Outcome(ProbeStatus.FAILED, f"{run.errors.count} of {len(run.records)} requests failed: "
                            f"{run.errors.describe()}", metrics=metrics)
        return Outcome(ProbeStatus.PASSED, f"{passes} pass(es) of {len(self.workload)} requests without an error",
                        metrics=metrics)


def burst_probe(check: HealthCheck, gpu: GpuView | None, workload: Workload, prompts: PromptSynth) -> LoadProbe:
    return LoadProbe(check, gpu, name="burst", workload=workload, prompts=prompts)


def soak_probe(check: HealthCheck, gpu: GpuView | None, workload: Workload, prompts: PromptSynth,
               duration_s: float) -> LoadProbe:
    return LoadProbe(check, gpu, name="soak", workload=workload, prompts=prompts, repeat_until_s=duration_s)

