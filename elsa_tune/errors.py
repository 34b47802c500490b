"""The one exception tree of elsa-tune, split by what the caller does next.

    ElsaTuneError                  every error carries ``remedy``: what the user should do
    ├── CandidateError             record the outcome and continue the study
    │   ├── BootFailed             the runtime did not come up; carries a classified ``Failure``
    │   ├── ServerDied             the runtime died or hung after it was ready
    │   ├── ProbeFailed            a probe found a crash, an OOM, a hang or a quality regression
    │   └── MeasurementFailed      a run produced no usable output (empty, mostly failed)
    └── StudyError                 stop the study; the message names the remedy
        ├── ConfigError            a bad search space, flag, argument or traffic file
        │   └── SpaceError         a search-space file is wrong (points at file and line)
        ├── EnvironmentError_      the machine is not fit: no GPU, busy GPU, missing runtime
        ├── RuntimeUnavailable     the runtime command/image cannot be started at all
        ├── TrafficError           a trace cannot be read, recorded or replayed
        └── HistoryError           the study store or ledger is unreadable or inconsistent

The CLI maps these to exit codes in one place (``elsa_tune.tuner.cli``) through ``exit_code``, whose values
are the one table of ``elsa_tune.exit_codes``.
Nothing below the CLI calls ``sys.exit`` or prints. Foreign exceptions are translated at the
boundary with ``raise X(...) from exc``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from elsa_tune import exit_codes

if TYPE_CHECKING:  # pragma: no cover - types only, runtime owns Failure
    from elsa_tune.runtime.failure import Failure


class ElsaTuneError(Exception):
    """Base of every error elsa-tune raises on purpose."""

    exit_code: ClassVar[int] = exit_codes.FAILED

    def __init__(self, message: str, *, remedy: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.remedy = remedy

    def explain(self) -> str:
        """One paragraph for a person: the cause, then the fix."""
        if self.remedy:
            return f"{self.message}\n  remedy: {self.remedy}"
        return self.message


# ---- record and continue -------------------------------------------------------------------------


class CandidateError(ElsaTuneError):
    """A candidate configuration failed; the study records it and goes on."""

    exit_code = exit_codes.CANDIDATE


class BootFailed(CandidateError):
    """The runtime did not reach readiness. ``failure`` says why, with evidence lines."""

    def __init__(self, failure: Failure, *, log_path: str | None = None) -> None:
        super().__init__(f"boot failed: {failure.kind.value}: {failure.summary}", remedy=failure.remedy)
        self.failure = failure
        self.log_path = log_path


class ServerDied(CandidateError):
    """The runtime was ready, then died or hung. ``failure`` classifies it when known."""

    def __init__(self, message: str, *, failure: Failure | None = None, remedy: str = "") -> None:
        super().__init__(message, remedy=remedy or (failure.remedy if failure else ""))
        self.failure = failure


class ProbeFailed(CandidateError):
    """A stress probe or the quality gate rejected the candidate."""


class MeasurementFailed(CandidateError):
    """A run produced no usable measurement: never reported as zeros."""


# ---- stop the study ------------------------------------------------------------------------------


class StudyError(ElsaTuneError):
    """The study cannot go on; the message names the remedy."""

    exit_code = exit_codes.USAGE


class ConfigError(StudyError):
    """A bad argument, flag, search space or setting."""

    exit_code = exit_codes.USAGE


class SpaceError(ConfigError):
    """A search-space file is wrong. ``path`` and ``line`` point at the culprit when known."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None, remedy: str = "") -> None:
        where = f"{path}:{line}: " if path and line else (f"{path}: " if path else "")
        super().__init__(where + message, remedy=remedy)
        self.path = path
        self.line = line


class EnvironmentError_(StudyError):
    """The machine is not fit for a study: missing GPU, GPU in use, driver trouble."""

    exit_code = exit_codes.ENVIRONMENT


class RuntimeUnavailable(StudyError):
    """The runtime's launch command or image cannot be run at all."""

    exit_code = exit_codes.ENVIRONMENT


class TrafficError(StudyError):
    """A trace cannot be read, recorded or replayed."""

    exit_code = exit_codes.USAGE


class HistoryError(StudyError):
    """The study store or the ledger is unreadable or inconsistent."""

    exit_code = exit_codes.HISTORY
