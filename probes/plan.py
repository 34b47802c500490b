"""The probes a boot runs, in one place: which apply to the boot, in which order, and the budget they run under.

``boot_probes`` lists, for a candidate's probed boot, in order:

1. ``long_context``: needles in a prompt at the study's context target (never more than the pool and context length
   the server reported);
2. ``long_context_concurrent``: the same beside long sampled generations in every other running slot (a 200K prompt
   beside seven long generations crashed a server whose single long prompt passed), when the server has more
   than one slot;
3. ``burst``: the busiest window of the traffic at the slot limit;
4. ``vision``: a maximum-size image in a ~29K-token request, for a vision model (the vision encoder's temporaries
   live outside the KV pool: a config 144 MiB short survived hours of text traffic and died on the first big image).

The quality gate follows them (``probes/quality.py``), and the final confirmation's boot adds a ``soak``. A
``ProbeSpec`` says what to send; how it reaches the server (HTTP, or the simulator's engine) is the booter's
``ServerLoad``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

from elsa_tune.probes.protocol import ProbeBudget
from elsa_tune.probes.vision import DEFAULT_TARGET_TOKENS
from elsa_tune.traffic.workload import Workload

MIB = 1024 * 1024
#: the first token of a probe request may wait behind a long prefill, but never longer than this
MAX_FIRST_TOKEN_S = 300.0
#: output tokens of each long generation beside the concurrent long-context probe's prompt
CONCURRENT_OUTPUT_TOKENS = 2048


class ProbeKind(enum.Enum):
    LONG_CONTEXT = "long_context"
    LONG_CONTEXT_CONCURRENT = "long_context_concurrent"
    BURST = "burst"
    VISION = "vision"
    SOAK = "soak"


@dataclass(frozen=True)
class ProbeSpec:
    """One probe to run: its kind and what it sends.

    ``target_tokens``: the prompt length (long context, vision); ``generations`` and ``output_tokens``: the long
    generations beside the concurrent long-context prompt; ``workload``: the requests of a burst or a soak;
    ``seconds``: how long a soak repeats its workload; ``check_needles``: whether a long-context probe checks what
    the model retrieves (false for a model that does not retrieve: then only that the prompt is served).
    """

    kind: ProbeKind
    target_tokens: int = 0
    generations: int = 0
    output_tokens: int = 0
    workload: Workload | None = None
    seconds: float = 0.0
    check_needles: bool = True

    @property
    def name(self) -> str:
        return self.kind.value


def boot_probes(*, context_target: int | None, slots: int | None, burst: Workload | None,
                vision: bool, check_needles: bool = True) -> tuple[ProbeSpec, ...]:
    """The stress probes of a candidate's probed boot that apply, in order (see the module docstring).

    ``slots`` is the running-request limit the server reported; ``vision`` whether the space's model takes images.
    """
    specs: list[ProbeSpec] = []
    if context_target:
        specs.append(ProbeSpec(ProbeKind.LONG_CONTEXT, target_tokens=context_target, check_needles=check_needles))
        if slots is not None and slots > 1:
            specs.append(ProbeSpec(ProbeKind.LONG_CONTEXT_CONCURRENT, target_tokens=context_target,
                                   generations=slots - 1, output_tokens=CONCURRENT_OUTPUT_TOKENS,
                                   check_needles=check_needles))
    if burst is not None:
        specs.append(ProbeSpec(ProbeKind.BURST, workload=burst))
    if vision:
        specs.append(ProbeSpec(ProbeKind.VISION, target_tokens=DEFAULT_TARGET_TOKENS))
    return tuple(specs)


def soak(workload: Workload, seconds: float) -> ProbeSpec:
    """The soak of the final confirmation: ``workload`` repeated for ``seconds``."""
    return ProbeSpec(ProbeKind.SOAK, workload=workload, seconds=seconds)


class ProbeSettingsLike(Protocol):
    """What the budget reads of a space's ``probes:`` section (``search_spaces.space.ProbeSettings``)."""

    @property
    def headroom_floor_mib(self) -> int: ...
    @property
    def probe_timeout_s(self) -> float: ...
    @property
    def hang_s(self) -> float: ...


def budget_from_settings(settings: ProbeSettingsLike) -> ProbeBudget:
    """A probe budget from a space's ``probes:`` section (defaults: 512 MiB floor, 900 s per probe, 120 s hang)."""
    request_timeout = max(settings.hang_s, min(MAX_FIRST_TOKEN_S, settings.probe_timeout_s))
    return ProbeBudget(deadline_s=settings.probe_timeout_s, request_timeout_s=request_timeout,
                       hang_s=settings.hang_s, headroom_floor_bytes=settings.headroom_floor_mib * MIB)
