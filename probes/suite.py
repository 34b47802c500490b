"""The probes a candidate's first boot runs, built from the search space, and how they are run.

``ProbeSuite.from_space`` reads the space's ``probes:`` section (headroom floor, probe timeout, hang seconds;
the loader rejects bad values) and its model (context target, vision) and builds, in order:

1. ``long_context``: needles in a prompt as long as the context target allows (never more than the pool
   and context length the server reported);
2. ``long_context_concurrent``: the same beside long sampled generations in every other running slot
   (seed 000: a 200K prompt beside seven long generations);
3. ``burst``: the busiest window of the traffic at the slot limit, when a workload is given;
4. ``vision``: a maximum-size image in a ~29K-token request (seed 001), ``SKIPPED`` without a vision model.

``run_all`` runs them in that order and stops once the server is dead or hung: later probes would only time
out against it, and the first failure is the one that explains the candidate.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from elsa_tune.probes.protocol import Probe, ProbeBudget, ProbeResult, ProbeStatus
from elsa_tune.probes.stress import HealthCheck, LongContextProbe, burst_probe
from elsa_tune.probes.vision import DEFAULT_TARGET_TOKENS, VisionProbe
from elsa_tune.runtime.failure import FailureKind
from elsa_tune.runtime.gpu import GpuView
from elsa_tune.runtime.protocol import HealthState, Server
from elsa_tune.traffic.prompts import PromptSynth
from elsa_tune.traffic.workload import Workload

log = logging.getLogger(__name__)

MIB = 1024 * 1024
#: the first token of a probe request may wait behind a long prefill, but never longer than this
MAX_FIRST_TOKEN_S = 300.0
#: with no context target the long-context probe fills whatever the server reports it can hold
NO_TARGET = 1 << 30


class ProbeSettingsLike(Protocol):
    """What the suite reads of a space's ``probes:`` section (``search_spaces.space.ProbeSettings``)."""

    @property
    def headroom_floor_mib(self) -> int: ...
    @property
    def probe_timeout_s(self) -> float: ...
    @property
    def hang_s(self) -> float: ...


class ModelLike(Protocol):
    """What the suite reads of a space's ``model:`` section (``search_spaces.space.ModelSpec``)."""

    @property
    def context_target(self) -> int | None: ...
    @property
    def vision(self) -> bool: ...


class SpaceLike(Protocol):
    """The parts of a ``SearchSpace`` the suite needs (probes sit below search_spaces in the layering)."""

    @property
    def model(self) -> ModelLike: ...
    @property
    def probes(self) -> ProbeSettingsLike: ...


def budget_from_settings(settings: ProbeSettingsLike) -> ProbeBudget:
    """A probe budget from a space's ``probes:`` section (defaults: 512 MiB floor, 900 s per probe, 120 s hang)."""
    request_timeout = max(settings.hang_s, min(MAX_FIRST_TOKEN_S, settings.probe_timeout_s))
    return ProbeBudget(deadline_s=settings.probe_timeout_s, request_timeout_s=request_timeout,
                       hang_s=settings.hang_s, headroom_floor_bytes=settings.headroom_floor_mib * MIB)


@dataclass(frozen=True)
class ProbeSuite:
    """An ordered list of probes and the budget each runs under."""

    probes: tuple[Probe, ...]
    budget: ProbeBudget
    check: HealthCheck

    @classmethod
    def from_space(cls, space: SpaceLike, check: HealthCheck, gpu: GpuView | None, *,
                   burst: Workload | None = None, prompts: PromptSynth | None = None,
                   concurrent_output_tokens: int = 2048, vision_tokens: int = DEFAULT_TARGET_TOKENS,
                   budget: ProbeBudget | None = None) -> ProbeSuite:
        """The first-boot probes for ``space``. ``burst`` (with its ``prompts``) adds the burst probe;
        ``budget`` overrides the one from the space's ``probes:`` section (tests use short ones)."""
        target = space.model.context_target or NO_TARGET
        probes: list[Probe] = [
            LongContextProbe(check, gpu, target_tokens=target),
            LongContextProbe(check, gpu, target_tokens=target, concurrent=True,
                             concurrent_output_tokens=concurrent_output_tokens),
        ]
        if burst is not None:
            if prompts is None:
                raise ValueError("a burst workload needs the prompt synthesiser its requests are built from")
            probes.append(burst_probe(check, gpu, burst, prompts))
        probes.append(VisionProbe(check, gpu, vision=space.model.vision, target_tokens=vision_tokens))
        return cls(probes=tuple(probes), budget=budget or budget_from_settings(space.probes), check=check)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.probes)

    def run_all(self, server: Server) -> tuple[ProbeResult, ...]:
        """Every probe in order until the server is dead or hung; the results of those that ran."""
        results: list[ProbeResult] = []
        for probe in self.probes:
            result = probe.run(server, self.budget)
            results.append(result)
            log.info("probe %s: %s — %s", result.name, result.status.value, result.detail)
            if result.status is ProbeStatus.FAILED and self._server_gone(server, result):
                skipped = [p.name for p in self.probes[len(results):]]
                if skipped:
                    log.info("probes %s not run: the server is %s", ", ".join(skipped),
                             "hung" if result.failure and result.failure.kind is FailureKind.HANG else "dead")
                break
        return tuple(results)

    def _server_gone(self, server: Server, result: ProbeResult) -> bool:
        if result.failure is not None and result.failure.kind is FailureKind.HANG:
            return True
        return self.check(server).state is HealthState.DEAD


def first_failure(results: Sequence[ProbeResult]) -> ProbeResult | None:
    """The result that rejects the candidate: the first one that did not pass (``SKIPPED`` passes)."""
    return next((r for r in results if not r.passed), None)
