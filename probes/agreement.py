"""Pure comparisons of a candidate's answers with the baseline's: tolerant, and never fail open.

Batching and speculative decoding legitimately change low-probability tokens, so greedy outputs are
compared with a tolerant metric (matching prefix and sequence similarity), and exact-answer accuracy
is compared with a paired exact test rather than a raw difference.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats


@dataclass(frozen=True)
class TextAgreement:
    """How closely a candidate's greedy outputs follow the baseline's, prompt by prompt."""

    prompts: int
    mean_similarity: float
    min_similarity: float
    mean_prefix_fraction: float
    identical: int

    def acceptable(self, min_mean: float = 0.85, min_each: float = 0.35) -> bool:
        return self.mean_similarity >= min_mean and self.min_similarity >= min_each


def _tokens(text: str) -> list[str]:
    return text.split()


def prefix_fraction(reference: Sequence[str], candidate: Sequence[str]) -> float:
    if not reference and not candidate:
        return 1.0
    n = 0
    for a, b in zip(reference, candidate, strict=False):
        if a != b:
            break
        n += 1
    return n / max(len(reference), len(candidate))


def agreement(reference: Sequence[str], candidate: Sequence[str]) -> TextAgreement:
    """Compare outputs pairwise (same prompts, same order). Raises on an empty or unequal set."""
    if len(reference) != len(candidate) or not reference:
        raise ValueError("agreement needs the same non-empty prompt set on both sides")
    sims: list[float] = []
    prefixes: list[float] = []
    identical = 0
    for ref, cand in zip(reference, candidate, strict=True):
        rt, ct = _tokens(ref), _tokens(cand)
        identical += rt == ct
        sims.append(difflib.SequenceMatcher(a=rt, b=ct, autojunk=False).ratio() if (rt or ct) else 1.0)
        prefixes.append(prefix_fraction(rt, ct))
    return TextAgreement(prompts=len(sims), mean_similarity=sum(sims) / len(sims), min_similarity=min(sims),
                         mean_prefix_fraction=sum(prefixes) / len(prefixes), identical=identical)


@dataclass(frozen=True)
class AccuracyComparison:
    """Paired exact-answer accuracy: McNemar's exact test on the discordant problems."""

    problems: int
    baseline_correct: int
    candidate_correct: int
    lost: int            # right on baseline, wrong on candidate
    gained: int          # wrong on baseline, right on candidate
    p_value: float       # one-sided: candidate worse

    def regressed(self, alpha: float = 0.05, max_drop: float = 0.10) -> bool:
        drop = (self.baseline_correct - self.candidate_correct) / self.problems
        return self.p_value < alpha or drop > max_drop


def compare_accuracy(baseline: Sequence[bool], candidate: Sequence[bool]) -> AccuracyComparison:
    if len(baseline) != len(candidate) or not baseline:
        raise ValueError("accuracy comparison needs the same non-empty problem set on both sides")
    lost = sum(1 for b, c in zip(baseline, candidate, strict=True) if b and not c)
    gained = sum(1 for b, c in zip(baseline, candidate, strict=True) if c and not b)
    discordant = lost + gained
    p = 1.0 if discordant == 0 else float(stats.binomtest(lost, discordant, 0.5, alternative="greater").pvalue)
    return AccuracyComparison(problems=len(baseline), baseline_correct=sum(baseline),
                              candidate_correct=sum(candidate), lost=lost, gained=gained,
                              p_value=p if math.isfinite(p) else 1.0)


def acceptance_collapsed(baseline: float | None, candidate: float | None, ratio: float = 0.7) -> bool | None:
    """A broken draft (e.g. FR-Spec on a repacked head): nothing errors, acceptance collapses. ``None`` when unknown."""
    if baseline is None or candidate is None or baseline <= 1.0:
        return None
    # compare the extra tokens per step beyond the bonus token, where collapse shows first
    return (candidate - 1.0) < ratio * (baseline - 1.0)
