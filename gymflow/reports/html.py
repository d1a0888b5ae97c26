"""`gymflow report RUN --html FILE`: one self-contained page (inline CSS, plots as data: URIs, no scripts),
so it can be mailed, attached to an issue or opened offline."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from datetime import UTC, datetime
from html import escape
from typing import Any

from gymflow.reports import plots
from gymflow.reports.data import Linker, RunData
from gymflow.reports.stats import Comparison, pass_at_k_curve
from gymflow.reports.text import fmt, signed

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;max-width:1280px;
color:#111827;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #e5e7eb}
h3{font-size:15px;margin:16px 0 6px}.muted{color:#6b7280}
table{border-collapse:collapse;margin:6px 0 12px}td,th{border:1px solid #e5e7eb;padding:4px 8px;text-align:left;
vertical-align:top}th{background:#f9fafb}td.num{text-align:right;font-variant-numeric:tabular-nums}
code,.id{font:12px ui-monospace,SFMono-Regular,Menlo,monospace}
.plots{display:grid;grid-template-columns:repeat(auto-fit,minmax(520px,1fr));gap:12px}
.plots img{width:100%;border:1px solid #e5e7eb;border-radius:6px;background:#fff}
.cmp{background:#eff6ff;border:1px solid #bfdbfe;border-radius:8px;padding:10px 14px}
.big{font-size:20px;font-weight:600}
"""


def _img(svg: str, alt: str) -> str:
    data = base64.b64encode(svg.encode()).decode()
    return f'<img alt="{escape(alt)}" src="data:image/svg+xml;base64,{data}">'


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], numeric: Sequence[int] = ()) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>"
                                    for i, c in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _rollout_ref(rid: str, linker: Linker) -> str:
    url = linker(rid)
    label = f'<span class="id">{escape(rid)}</span>'
    return f'<a href="{escape(url)}">{label}</a>' if url else label


def _run_section(data: RunData, linker: Linker) -> str:
    parts = [f"<h2>Run <code>{escape(data.run_id)}</code></h2>"]
    rows = [[escape(str(s["env"])), escape(str(s["model"])), s["rollouts"], s["completed"], s["failed"], s["running"],
             s["masked"], fmt(s["mean_reward"]), fmt(s["pass_at_k"])] for s in data.views["run_scores"]]
    parts.append(_table(["env", "model", "rollouts", "completed", "failed", "running", "masked", "mean reward",
                         "solved tasks"], rows, numeric=range(2, 9)))
    curve = pass_at_k_curve(data.rewards_by_task)
    if curve:
        parts.append("<h3>pass@k</h3>" + _table(["k", "pass@k", "tasks"],
                                                [[p.k, fmt(p.value), p.tasks] for p in curve], numeric=(0, 1, 2)))
    lat = data.views["latency_percentiles"]
    if lat:
        parts.append("<h3>Latency (s)</h3>" + _table(
            ["p50", "p90", "p99"], [[fmt(r["p50_s"]), fmt(r["p90_s"]), fmt(r["p99_s"])] for r in lat],
            numeric=(0, 1, 2)))
    total = sum(int(r["n"]) for r in data.views["failure_counts"])
    parts.append(f"<h3>Failures: {total} of {len(data.points)} rollouts</h3>")
    if data.failures:
        rows = [[f"<code>{escape(f['failure_type'])}</code><br><span class='muted'>{f['type_n']} in all, "
                 f"{f['messages']} messages</span>", f["n"], escape(f["failure_message"] or "(no message)"),
                 "<br>".join(_rollout_ref(rid, linker) for rid in f["examples"] or ())] for f in data.failures]
        parts.append(_table(["type", "count", "message", "examples"], rows, numeric=(1,)))
    else:
        parts.append("<p class='muted'>none</p>")
    return "\n".join(parts)


def _comparison(c: Comparison) -> str:
    ci = "no interval" if c.low is None else f"{c.confidence:.0%} CI [{signed(c.low)}, {signed(c.high)}]"
    return (f"<div class='cmp'><div>Mean reward of <code>{escape(c.label_b)}</code> (B) minus "
            f"<code>{escape(c.label_a)}</code> (A)</div><div class='big'>B &minus; A = {signed(c.diff)} "
            f"&nbsp; {escape(ci)}</div><div>A: {fmt(c.mean_a)} &nbsp; B: {fmt(c.mean_b)} &nbsp; "
            f"<span class='muted'>{escape(c.detail)}</span></div></div>")


def render_html(runs: Sequence[RunData], linker: Linker, comparison: Comparison | None = None) -> str:
    """The whole page for one run, or two with their comparison."""
    title = " vs ".join(r.run_id for r in runs)
    figures = [_img(plots.reward_histogram(runs), "reward histogram"), _img(plots.pass_at_k_plot(runs), "pass@k"),
               _img(plots.latency_cdf(runs), "latency CDF")]
    kinds = sorted({p["failure_type"] or "none" for r in runs for p in r.points
                    if p["status"] == "failed" or p["masked"]})
    figures += [_img(plots.failures_over_time(r, kinds_order=kinds), f"failures over time of {r.run_id}")
                for r in runs]
    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    body = [f"<h1>gymflow report: {escape(title)}</h1>",
            f"<div class='muted'>generated {generated}; rewards of completed, unmasked rollouts; "
            "pass@k counts reward &ge; 1 as a pass</div>"]
    if comparison is not None:
        body.append(_comparison(comparison))
    body.append("<h2>Plots</h2><div class='plots'>" + "".join(figures) + "</div>")
    body += [_run_section(r, linker) for r in runs]
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{escape(title)}</title>"
            f"<style>{CSS}</style></head><body>{''.join(body)}</body></html>\n")
