"""The report's plots as standalone SVG documents (matplotlib, no pyplot: no global figure state, no display).

Each SVG is embedded as a data: URI in an <img>, so the HTML needs no network and plots cannot clash over
element ids.
"""

from __future__ import annotations

import io
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime

import matplotlib
from matplotlib.axes import Axes
from matplotlib.dates import AutoDateLocator, ConciseDateFormatter, date2num
from matplotlib.figure import Figure

from gymflow.reports.data import RunData
from gymflow.reports.stats import pass_at_k_curve

SIZE = (6.4, 3.6)
COLORS = ("#2563eb", "#ea580c", "#16a34a", "#9333ea", "#0891b2", "#ca8a04", "#db2777", "#4b5563")  # one per run
FAILURE_COLORS = ("#dc2626", "#7c3aed", "#d97706", "#0d9488", "#be185d", "#4b5563", "#65a30d", "#1d4ed8")
# Fixed ids and no date: the same data gives the same bytes, so committed reports diff cleanly.
RC = {"svg.hashsalt": "gymflow", "svg.fonttype": "path", "axes.spines.top": False, "axes.spines.right": False,
      "font.size": 9}


def _svg(fig: Figure) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    return buf.getvalue()


def _figure(title: str) -> tuple[Figure, Axes]:
    fig = Figure(figsize=SIZE, layout="constrained")
    ax = fig.add_subplot()
    ax.set_title(title, loc="left", fontsize=10, fontweight="bold")
    ax.grid(True, alpha=0.3)
    return fig, ax


def _empty(ax: Axes, note: str) -> None:
    ax.text(0.5, 0.5, note, ha="center", va="center", transform=ax.transAxes, color="#6b7280")


def reward_histogram(runs: Sequence[RunData]) -> str:
    with matplotlib.rc_context(RC):
        fig, ax = _figure("Reward histogram (scored rollouts)")
        values = [r.rewards for r in runs]
        flat = [v for vs in values for v in vs]
        if not flat:
            _empty(ax, "no scored rollouts")
        else:
            lo, hi = min(0.0, min(flat)), max(1.0, max(flat))
            bins = [lo + (hi - lo) * i / 20 for i in range(21)]
            # Several runs: bars side by side in each bin, not overlaid, so none hides another.
            ax.hist(values, bins=bins, label=[f"{r.run_id} (n={len(v)})" for r, v in zip(runs, values, strict=True)],
                    color=[COLORS[i % len(COLORS)] for i in range(len(runs))], edgecolor="white")
            ax.set_xlabel("reward")
            ax.set_ylabel("rollouts")
            ax.legend(frameon=False)
        return _svg(fig)


def pass_at_k_plot(runs: Sequence[RunData]) -> str:
    with matplotlib.rc_context(RC):
        fig, ax = _figure("pass@k (unbiased estimator, mean over tasks)")
        drawn = partial = False
        for i, run in enumerate(runs):
            curve = pass_at_k_curve(run.rewards_by_task)
            if curve:
                drawn = True
                color, total = COLORS[i % len(COLORS)], len(run.rewards_by_task)
                ax.plot([p.k for p in curve], [p.value for p in curve], color=color,
                        label=f"{run.run_id} ({total} tasks)")
                # Beyond the smallest sample count, fewer tasks are averaged (failed samples): hollow markers,
                # since the curve there is over another set of tasks and need not rise.
                ax.scatter([p.k for p in curve], [p.value for p in curve], color=color, zorder=3,
                           facecolors=[color if p.tasks == total else "white" for p in curve])
                partial = True if any(p.tasks < total for p in curve) else partial
        if partial:
            ax.text(0.99, 0.02, "hollow: averaged over fewer tasks (k > samples of some task)", fontsize=7,
                    ha="right", va="bottom", transform=ax.transAxes, color="#6b7280")
        if drawn:
            ax.set_xlabel("k (samples per task)")
            ax.set_ylabel("pass@k")
            ax.set_ylim(-0.02, 1.02)
            ax.xaxis.get_major_locator().set_params(integer=True)
            ax.legend(frameon=False)
        else:
            _empty(ax, "no scored rollouts")
        return _svg(fig)


def latency_cdf(runs: Sequence[RunData]) -> str:
    with matplotlib.rc_context(RC):
        fig, ax = _figure("Latency CDF (seconds per rollout)")
        drawn = False
        for i, run in enumerate(runs):
            xs = sorted(run.latencies)
            if xs:
                drawn = True
                ys = [(j + 1) / len(xs) for j in range(len(xs))]
                ax.step(xs, ys, where="post", color=COLORS[i % len(COLORS)], label=f"{run.run_id} (n={len(xs)})")
        if drawn:
            ax.set_xlabel("latency (s)")
            ax.set_ylabel("fraction of rollouts")
            ax.set_ylim(0, 1.02)
            ax.legend(frameon=False, loc="lower right")
        else:
            _empty(ax, "no finished rollouts")
        return _svg(fig)


def failures_over_time(run: RunData, bins: int = 24, kinds_order: Sequence[str] = ()) -> str:
    """Failed (or masked) rollouts per time bin of finished_at, stacked by failure type. Types get their colour
    by their place in `kinds_order` (then by name), so one type has one colour in every run's plot."""
    with matplotlib.rc_context(RC):
        fig, ax = _figure(f"Failures over time: {run.run_id}")
        by_type: dict[str, list[datetime]] = defaultdict(list)
        for p in run.points:
            if (p["status"] == "failed" or p["masked"]) and p["finished_at"] is not None:
                by_type[p["failure_type"] or "none"].append(p["finished_at"])
        finished = [p["finished_at"] for p in run.points if p["finished_at"] is not None]
        if not by_type:
            _empty(ax, "no failures")
            return _svg(fig)
        start, end = date2num(min(finished)), date2num(max(finished))
        if end <= start:
            end = start + 1 / 86400  # one second: every rollout finished at the same instant
        edges = [start + (end - start) * i / bins for i in range(bins + 1)]
        palette = list(kinds_order) + sorted(set(by_type) - set(kinds_order))
        kinds = sorted(by_type, key=palette.index)
        ax.hist([date2num(by_type[k]) for k in kinds], bins=edges, stacked=True, label=kinds,
                color=[FAILURE_COLORS[palette.index(k) % len(FAILURE_COLORS)] for k in kinds], edgecolor="white",
                linewidth=0.4)
        locator = AutoDateLocator()
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(ConciseDateFormatter(locator))
        ax.set_xlabel("finished at (UTC)")
        ax.set_ylabel("failed rollouts")
        ax.yaxis.get_major_locator().set_params(integer=True)
        ax.legend(frameon=False, fontsize=8)
        return _svg(fig)
