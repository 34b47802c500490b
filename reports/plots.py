"""The report's figures, drawn with matplotlib's Agg canvas and returned as PNG bytes.

No global backend is set and no window is opened (``Figure`` + ``FigureCanvasAgg``), so rendering works
headless and inside a running study. A figure without data is ``None``, never an empty chart.
"""

from __future__ import annotations

import io
import statistics
from collections.abc import Sequence

from matplotlib.artist import Artist
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from elsa_tune.history.records import Arm
from elsa_tune.reports.model import AbRow, BootRow, Report

MiB = 1024 * 1024
_PHASE_COLOURS = {"baseline": "#4c72b0", "screening": "#8172b3", "search": "#55a868", "confirmation": "#dd8452"}
_CONFIRMATION_BASELINE = "#937860"
_FAILED = "#d62728"
_DPI = 110


def search_plot(report: Report) -> bytes | None:
    """Per-boot throughput in boot order, coloured by phase (the confirmation's two arms apart); crashed or
    infeasible boots marked on the floor; and the incumbent's measured worth: at each boot, the mean of every
    measured boot so far of the configuration that was the incumbent then (the A/Bs' incumbent arm), never the
    best single boot."""
    rows = report.boots
    if not rows:
        return None
    fig = Figure(figsize=(8.0, 3.6), dpi=_DPI)
    ax = fig.add_subplot()
    measured = [r for r in rows if r.throughput is not None]
    for name, colour, pts in _series(measured):
        ax.scatter([r.number for r in pts], [float(r.throughput or 0.0) for r in pts], s=28, color=colour,
                   label=name, zorder=3)
    failed = [r for r in rows if not r.outcome.feasible]
    floor = min((r.throughput for r in measured if r.throughput is not None), default=1.0) * 0.9
    if failed:
        ax.scatter([r.number for r in failed], [floor] * len(failed), marker="x", s=40, color="#d62728",
                   label="crashed / infeasible", zorder=4)
    worth = incumbent_worth(rows)
    if worth:
        ax.step([n for n, _ in worth], [v for _, v in worth], where="post", color="#333333", linewidth=1.4,
                label="incumbent (mean of its boots so far)", zorder=2)
    ax.set_xlabel("boot")
    ax.set_ylabel("output tok/s (per-boot mean)")
    ax.set_title("Objective per boot")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.subplots_adjust(bottom=0.14)
    return _png(fig)


def incumbent_worth(rows: Sequence[BootRow]) -> list[tuple[int, float]]:
    """(boot number, the incumbent's mean throughput over its measured boots up to that boot) at every measured
    boot of the incumbent arm: the incumbent changes when an A/B's incumbent arm boots another configuration.
    The confirmation tests the study's incumbent as its candidate arm against the baseline, so there the
    candidate arm is the incumbent."""
    seen: dict[str, list[float]] = {}
    points: list[tuple[int, float]] = []
    for r in sorted(rows, key=lambda r: r.number):
        if r.throughput is None:
            continue
        seen.setdefault(r.key, []).append(r.throughput)
        if r.arm == (Arm.CANDIDATE if r.phase == "confirmation" else Arm.INCUMBENT).value:
            points.append((r.number, statistics.fmean(seen[r.key])))
    return points


def _series(rows: Sequence[BootRow]) -> list[tuple[str, str, list[BootRow]]]:
    out = []
    for phase, colour in _PHASE_COLOURS.items():
        pts = [r for r in rows if r.phase == phase]
        if phase == "confirmation":
            out += [(f"confirmation: {'baseline' if arm == Arm.INCUMBENT.value else 'winner'}", c,
                     [r for r in pts if r.arm == arm])
                    for arm, c in ((Arm.INCUMBENT.value, _CONFIRMATION_BASELINE), (Arm.CANDIDATE.value, colour))]
        else:
            out.append((phase, colour, pts))
    return [(name, colour, pts) for name, colour, pts in out if pts]


def forest_plot(rows: Sequence[AbRow]) -> bytes | None:
    """Each A/B's throughput effect with its confidence interval (ratio, 1 = no change)."""
    usable = [r for r in rows if r.verdict.effect is not None]
    if not usable:
        return None
    height = min(0.3 * len(usable) + 1.4, 16.0)
    fig = Figure(figsize=(8.0, height), dpi=_DPI)
    ax = fig.add_subplot()
    ordered = list(reversed(usable))
    colours = [{"yes": "#2ca02c", "no": "#d62728"}.get(r.kept.value, "#7f7f7f") for r in ordered]
    with_ci = [(y, r, c) for y, (r, c) in enumerate(zip(ordered, colours, strict=True))
               if r.verdict.ci_low is not None and r.verdict.ci_high is not None]
    ax.hlines([y for y, _, _ in with_ci], [((r.verdict.ci_low or 1.0) - 1) * 100 for _, r, _ in with_ci],
              [((r.verdict.ci_high or 1.0) - 1) * 100 for _, r, _ in with_ci], colors=[c for _, _, c in with_ci],
              linewidth=2)
    ax.scatter([((r.verdict.effect or 1.0) - 1) * 100 for r in ordered], range(len(ordered)), color=colours,
               zorder=3)
    ax.axvline(0, color="#333333", linewidth=1)
    ax.set_yticks(range(len(usable)))
    ax.set_yticklabels([_short(r.technique) for r in reversed(usable)], fontsize=8 if len(usable) <= 30 else 6)
    ax.set_xlabel("throughput change vs incumbent, % (with the gate's confidence interval)")
    ax.set_title("A/B effects")
    ax.grid(alpha=0.3, axis="x")
    fig.subplots_adjust(left=0.3, right=0.97, bottom=0.55 / height, top=1 - 0.35 / height)
    return _png(fig)


def headroom_plot(rows: Sequence[BootRow], floor_bytes: int | None = None) -> bytes | None:
    """Minimum free GPU memory seen per boot (MiB), with crashed boots marked."""
    usable = [r for r in rows if r.min_free_bytes is not None]
    if not usable:
        return None
    fig = Figure(figsize=(8.0, 3.4), dpi=_DPI)
    ax = fig.add_subplot()
    colours = [_FAILED if not r.outcome.feasible else _PHASE_COLOURS.get(r.phase, "#4c72b0") for r in usable]
    # one LineCollection instead of a patch per boot: hundreds of boots render in well under a second
    ax.vlines([r.number for r in usable], 0, [(r.min_free_bytes or 0) / MiB for r in usable], colors=colours,
              linewidth=max(1.0, min(8.0, 400 / len(usable))))
    shown = [(phase, colour) for phase, colour in _PHASE_COLOURS.items()
             if any(r.phase == phase and r.outcome.feasible for r in usable)]
    if any(not r.outcome.feasible for r in usable):
        shown.append(("crashed / failed a probe", _FAILED))
    handles: list[Artist] = [Patch(color=colour, label=name) for name, colour in shown]
    if floor_bytes:
        handles.append(ax.axhline(floor_bytes / MiB, color=_FAILED, linestyle="--", linewidth=1,
                                  label="headroom floor"))
    ax.legend(handles=handles, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=len(handles),
              frameon=False)
    ax.set_xlabel("boot")
    ax.set_ylabel("min free GPU memory, MiB")
    ax.set_title("Memory headroom per boot, by phase")
    ax.grid(alpha=0.3, axis="y")
    fig.subplots_adjust(bottom=0.3)
    return _png(fig)


def _short(text: str, limit: int = 38) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _png(fig: Figure) -> bytes:
    canvas = FigureCanvasAgg(fig)
    buffer = io.BytesIO()
    canvas.print_png(buffer)  # type: ignore[no-untyped-call]
    return buffer.getvalue()
