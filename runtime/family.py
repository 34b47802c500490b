"""The runtime-family seam: what differs between SGLang, llama.cpp and vLLM, behind one small protocol.

A ``RuntimeFamily`` owns everything a study needs to know about one kind of server and nothing about how it
is run (a process, a container, a simulated card): its default launch command and the flags it reserves
(host, port), how its own help lists flags (``--help``; vLLM's ``--help=all``) and reads a launch command, the
log line that says it is ready (or none: vLLM 0.33 is ready when ``/health`` answers), how its startup log
becomes a ``BootReport`` and how ``log explain`` shows one, how a failure in its log becomes a classified
``Failure`` (and which failures stop the whole study), what its info endpoints serve, the Prometheus series its
``/metrics`` exports, and how its winner is deployed. The process and Docker runtimes take a family; nothing
else in the tuner asks which one it was given.

``family(name)`` returns the implementation of a ``FamilyName``; ``detect(log_text)`` the family whose log a
text is. ``tests/runtime/test_family_contract.py`` is the suite every family passes.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import httpx

from elsa_tune.errors import ConfigError, StudyError
from elsa_tune.runtime.boot_report import BootReport
from elsa_tune.runtime.failure import Failure, FailureHints
from elsa_tune.runtime.flags import FlagSet

if TYPE_CHECKING:   # search spaces name their family: importing them here would be circular
    from elsa_tune.search_spaces.candidate import Candidate


class FamilyName(enum.Enum):
    """The runtime families elsa-tune can tune."""

    SGLANG = "sglang"
    LLAMACPP = "llamacpp"
    VLLM = "vllm"


@dataclass(frozen=True)
class MetricNames:
    """The Prometheus series of one family under elsa-tune's names; ``None`` where the family exports none.

    Counters: ``prompt_tokens``, ``generation_tokens``, ``cached_prompt_tokens``, ``requests`` (finished
    requests), ``spec_draft_tokens`` and ``spec_accepted_tokens``. Gauges: ``running``, ``waiting`` and
    ``kv_usage`` (a fraction). ``missing`` says in a sentence what a workload recorded from these series cannot
    recover. ``renamed`` maps a series' name in older versions of the runtime to its name here
    (vLLM's ``gpu_cache_usage_perc`` became ``kv_cache_usage_perc``). ``prompt_includes_cached`` says whether the
    prompt counter counts the tokens served from the prefix cache too (vLLM) or only those processed (llama.cpp).
    """

    prefix: str
    prompt_tokens: str | None
    generation_tokens: str | None
    cached_prompt_tokens: str | None
    requests: str | None
    running: str | None
    waiting: str | None
    kv_usage: str | None
    spec_draft_tokens: str | None
    spec_accepted_tokens: str | None
    missing: str = ""
    renamed: Mapping[str, str] = field(default_factory=dict)
    prompt_includes_cached: bool = False


@dataclass(frozen=True)
class Deployment:
    """How a family's winner is deployed (``best/``): its upstream container image and the launch inside it,
    how ``server-args.yaml`` is used, the Compose service's name, the runtime's name in the files' headers,
    whether the image has a tag per runtime version (``v0.5.23``) or one moving tag (``server-cuda``), and
    whether the launch takes the model as its first positional argument (vLLM's ``vllm serve MODEL``; its config
    file names it by the model flag all the same)."""

    upstream_image: str
    container_launch: tuple[str, ...]
    config_use: str
    service: str
    display_name: str
    tag_per_version: bool
    model_positional: bool = False


@dataclass(frozen=True)
class ReportSection:
    """One titled block of ``log explain``'s text: labelled values, in order."""

    title: str
    rows: tuple[tuple[str, str], ...]


class RuntimeFamily(Protocol):
    """One kind of LLM server, as the process and Docker runtimes, preflight and ``log explain`` read it."""

    @property
    def name(self) -> FamilyName: ...

    @property
    def default_launch(self) -> tuple[str, ...]:
        """The launch command when neither ``--launch`` nor the space's ``runtime.command`` names one."""
        ...

    @property
    def model_flag(self) -> str:
        """The flag that names the model (``model-path`` for SGLang, ``model`` for llama.cpp)."""
        ...

    @property
    def ready_line(self) -> str | None:
        """A fragment of the log line the server prints once it serves, or ``None`` when it prints none (vLLM
        0.33): then readiness is ``/health`` alone. Readiness always needs ``/health``."""
        ...

    @property
    def help_flag(self) -> str:
        """The argument that makes the launch command list every flag it accepts (``--help``, ``--help=all``)."""
        ...

    @property
    def help_env(self) -> Mapping[str, str]:
        """Environment variables the help listing needs on any machine (vLLM's device type without a GPU)."""
        ...

    @property
    def slots_flag(self) -> str:
        """The flag that sets how many requests run at once (``max-running-requests``, ``parallel``)."""
        ...

    @property
    def metrics(self) -> MetricNames: ...

    @property
    def deployment(self) -> Deployment: ...

    def resolve_launch(self, launch: Sequence[str]) -> tuple[str, ...]:
        """The launch command to run for ``launch``: itself, or where the family's own install put its program
        when ``launch`` is the bare default and it is not on ``PATH``."""
        ...

    def installed_version(self, launch: Sequence[str]) -> str | None:
        """The version the launch command reports (bounded), or ``None`` when it cannot say."""
        ...

    def vocabulary_size(self, model_path: str | None) -> int | None:
        """How many token ids the model at ``model_path`` has, when the family can read it from the model file
        without loading it (prompts are token ids and must stay inside the vocabulary); ``None`` otherwise."""
        ...

    def argv(self, launch: Sequence[str], candidate: Candidate, host: str, port: int) -> list[str]:
        """The exact command line of a boot: ``launch``, the candidate's flags, and the host and port we own."""
        ...

    def parse_help(self, text: str, source: str = "") -> FlagSet:
        """The flags the runtime's own ``--help`` text lists."""
        ...

    def read_flags(self, text: str) -> Candidate:
        """The requested flags of a launch command (or of flags alone) in this family's spelling, under the names
        ``Candidate.flags`` uses; ``ConfigError`` for text that is not one."""
        ...

    def explain(self, report: BootReport) -> tuple[ReportSection, ...]:
        """What ``log explain`` shows of a boot report in this family's words, first the report itself (buffers,
        phases, adjustments, warnings and the failure are shown the same way for every family)."""
        ...

    def boot_report(self, log_text: str, candidate: Candidate | None = None,
                    info: Mapping[str, Any] | None = None) -> BootReport:
        """What a boot really produced: the startup log, then the info endpoints, then the adjustments
        (requested against effective, each with the line that proves it)."""
        ...

    def server_info(self, client: httpx.Client, base_url: str, timeout_s: float) -> dict[str, Any] | None:
        """What the server's info endpoints say about itself, or ``None`` when none answers."""
        ...

    def classify(self, log_text: str, hints: FailureHints | None = None) -> Failure:
        """How a boot or a server failed, from its log; never raises (an unknown cause is ``UNKNOWN_CRASH``)."""
        ...

    def looks_failed(self, log_text: str) -> bool:
        """Whether the log shows a failure signature at all."""
        ...

    def study_stopper(self, log_text: str) -> StudyError | None:
        """A failure no other candidate would escape (no runtime, no model, no device): stop the study."""
        ...

    def recognises(self, log_text: str) -> bool:
        """Whether ``log_text`` was written by this family's server."""
        ...


def of_runtime_name(runtime: str | None) -> RuntimeFamily:
    """The family of a fingerprint's runtime name (``sglang``, ``sglang-sim``, ``llamacpp``, ``vllm``); SGLang by
    default."""
    for name in FamilyName:
        if runtime is not None and runtime.split("-")[0] == name.value:
            return family(name)
    return family(FamilyName.SGLANG)


def family(name: FamilyName | str) -> RuntimeFamily:
    """The implementation of ``name`` (a ``FamilyName`` or its value); ``ConfigError`` for an unknown name."""
    try:
        key = name if isinstance(name, FamilyName) else FamilyName(name)
    except ValueError:
        known = ", ".join(f.value for f in FamilyName)
        raise ConfigError(f"unknown runtime family {name!r}", remedy=f"use one of: {known}") from None
    if key is FamilyName.LLAMACPP:
        from elsa_tune.runtime.llamacpp.family import LLAMACPP

        return LLAMACPP
    if key is FamilyName.VLLM:
        from elsa_tune.runtime.vllm.family import VLLM

        return VLLM
    from elsa_tune.runtime.sglang import SGLANG

    return SGLANG


def detect(log_text: str) -> RuntimeFamily | None:
    """The family whose server wrote ``log_text``, or ``None`` when no family recognises it."""
    for name in FamilyName:
        candidate = family(name)
        if candidate.recognises(log_text):
            return candidate
    return None
