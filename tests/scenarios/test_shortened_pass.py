"""A pass the baseline shortens for a slow model still shows the queueing of the trace (``Study._fit_pass``).

A closed-loop pass opens with every client stream sending at once. Shortened to 2 requests per stream, half of the
pass is that burst, and in a burst fewer slots give the first prompts their first token sooner: generated scenario
68 (a ~20 tok/s model, 4 streams, demo traffic) then measures ``--max-running-requests 2`` at TTFT p50 ×0.83 of the
baseline's 4 slots, where the trace's own pass (and the oracle) finds ×3.4, each later request queued behind a slot.
Every number here is the simulator's noiseless truth, not a measurement.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from oracle import Oracle, lattice
from scenario import generate

from elsa_tune.runtime.sim.truth import TruthWorkload
from elsa_tune.search_spaces.candidate import Candidate
from elsa_tune.traffic.workload import closed_loop
from elsa_tune.tuner.settings import Settings
from elsa_tune.tuner.study import MIN_REQUESTS_PER_STREAM, PASS_TOLERANCE, shortened_requests
from elsa_tune.tuner.virtual import truth_workload


def test_a_pass_is_shortened_to_the_target_but_keeps_its_steady_state() -> None:
    assert shortened_requests(31, took=100.0, target=63.0, concurrency=4) is None           # within tolerance
    assert shortened_requests(400, took=400.0, target=100.0, concurrency=4) == 100           # scaled to the target
    assert shortened_requests(31, took=354.0, target=63.0, concurrency=4) == MIN_REQUESTS_PER_STREAM * 4
    assert shortened_requests(15, took=354.0, target=63.0, concurrency=4) is None            # already at the floor
    assert MIN_REQUESTS_PER_STREAM >= 4     # the burst and the wave that arrives into it: at most half the pass
    assert PASS_TOLERANCE > 1


def test_a_shortened_pass_keeps_the_ttft_verdicts_of_the_trace(tmp_path: Path) -> None:
    """No configuration of the space is within the TTFT p50 guardrail on the shortened pass but not on the trace's
    (the whole space, not one candidate: 6 of 27 configurations flipped at 2 requests per stream)."""
    s = generate(68, tmp_path)
    oracle = Oracle(s.profile, s.space, s.traffic)
    pre, runtime, space = oracle.bench.pre, oracle.bench.runtime, oracle.space
    base = space.baseline()
    target = Settings(budget_s=8 * 3600).pass_s                     # the 8-hour night's planned pass
    took = runtime.serve(base, oracle.workload).makespan_s          # its noiseless length: ~5x the plan
    n = shortened_requests(len(pre.workload), took=took, target=target, concurrency=pre.concurrency)
    assert n is not None                                             # the study shortens this pass
    short = truth_workload(closed_loop(pre.trace, concurrency=pre.concurrency, n_requests=n), f"short-{n}")
    params = oracle.effective_parameters()
    configs = [space.candidate({**space.baseline_values(), **dict(zip([p.name for p in params], v, strict=True))}, [])
               for v in itertools.product(*(lattice(p) for p in params))]
    configs = [c for c in configs if runtime.launch(c).failure is None]
    margin = 1 + space.guardrails.ttft_p50_margin

    def within(c: Candidate, workload: TruthWorkload) -> bool:
        b, t = runtime.serve(base, workload), runtime.serve(c, workload)
        assert b.ttft_p50_s and t.ttft_p50_s
        return t.ttft_p50_s / b.ttft_p50_s <= margin

    assert any(not within(c, oracle.workload) for c in configs)     # the trace's queueing breaks some
    flipped = [c.key() for c in configs if within(c, short) and not within(c, oracle.workload)]
    assert not flipped, f"{len(flipped)} of {len(configs)} configurations pass TTFT only on the {n}-request pass"
