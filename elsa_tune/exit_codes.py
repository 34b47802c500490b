"""The one table of exit statuses every ``elsa-tune`` command returns.

    0    OK            the command did what it was asked
    1    FAILED        an ``ElsaTuneError`` without a more precise class
    2    USAGE         a bad argument, flag, search space or traffic file (``ConfigError``, argparse)
    3    CANDIDATE     a candidate failed where the command's result was that candidate (``CandidateError``)
    4    ENVIRONMENT   the machine or the runtime is not fit (``EnvironmentError_``, ``RuntimeUnavailable``)
    5    HISTORY       the study store or the ledger is unreadable or inconsistent (``HistoryError``)
    10   WORSE         ``compare``: B is worse than A (its interval lies below 1, or a guardrail is confidently worse)
    11   NO_DIFFERENCE ``compare``: no difference shown (the gate was inconclusive)
    12   EQUIVALENT    ``compare``: B is equivalent to A (the interval lies within ± the minimum effect)
    70   INTERNAL      a bug in elsa-tune (an exception that is not an ``ElsaTuneError``)
    130  INTERRUPTED   stopped by Ctrl-C / SIGTERM before the study finished

A bad input always ends in 1–5 with one paragraph and a remedy; 70 means the input found a bug. ``compare`` ends in
0 when B is better than A, 3 when B failed (crashed, ran out of memory, hung, gave wrong answers), else 10–12.
"""

from __future__ import annotations

OK = 0
FAILED = 1
USAGE = 2
CANDIDATE = 3
ENVIRONMENT = 4
HISTORY = 5
WORSE = 10
NO_DIFFERENCE = 11
EQUIVALENT = 12
INTERNAL = 70
INTERRUPTED = 130

#: The statuses a bad input may end in.
BAD_INPUT = frozenset({FAILED, USAGE, CANDIDATE, ENVIRONMENT, HISTORY})
