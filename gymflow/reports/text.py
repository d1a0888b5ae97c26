"""The terminal report and `gymflow show`, readable at 80 columns.

Wide tables truncate every header there (`singl…`, `rollo…`), so everything is laid out vertically: a
key/value block per section, long texts wrapped, ids and links each on their own line and never cut (a cut
link cannot be clicked). Long texts are abbreviated on purpose, with a marker saying by how much.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from rich import box
from rich.console import Console
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from gymflow.kernel.wire import shown_content
from gymflow.reports.data import Linker, RunData
from gymflow.reports.stats import Comparison, PassAtK, pass_at_k_curve

INDENT = 2


def fmt(value: Any, digits: int = 4) -> str:
    """A number people read: 4 significant digits, '-' for missing."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float) or type(value).__name__ == "Decimal":
        return f"{float(value):.{digits}g}"
    return str(value)


def signed(value: float | None) -> str:
    return "-" if value is None else f"{value:+.4g}"


def abbreviate(text: str, limit: int | None) -> str:
    """`text` cut at `limit` characters with a marker saying how much is hidden; `limit=None` keeps it all."""
    if limit is None or len(text) <= limit:
        return text
    return f"{text[:limit]} [... {len(text) - limit:,} more characters; --full shows all]"


def _pairs(rows: Sequence[tuple[str, str | Text]]) -> Table:
    """A header-less key/value table: nothing for a narrow terminal to truncate."""
    table = Table(show_header=False, box=None, padding=(0, 1), pad_edge=False)
    table.add_column("key", style="bold", no_wrap=True)
    table.add_column("value", overflow="fold")
    for key, value in rows:
        table.add_row(key, value)
    return table


def _heading(console: Console, text: str) -> None:
    console.print(Text(text, style="bold underline"), soft_wrap=True)


def _link_line(console: Console, rollout_id: str, linker: Linker, indent: int) -> None:
    url = linker(rollout_id)
    line = Text(" " * indent + rollout_id)
    if url:
        line.append("  ")
        line.append(url, style=f"link {url}")
    console.print(line, soft_wrap=True)  # soft wrap: the terminal folds it; rich never cuts an id or a URL


def pass_at_k_summary(curve: Sequence[PassAtK]) -> str:
    """pass@k at k = 1, 2, 4, ... and n: the full curve is in the HTML report."""
    if not curve:
        return "-"
    n = curve[-1].k
    ks = sorted({2**i for i in range(n.bit_length()) if 2**i <= n} | {n})
    return "  ".join(f"k={p.k}: {fmt(p.value)}" for p in curve if p.k in ks)


def render_scores(console: Console, data: RunData) -> None:
    version = f", score version {data.score_version} (a rescore; --score collected: the collect's own)" \
        if data.score_version else ""
    _heading(console, f"Scores (run_scores) of run {data.run_id}{version}")
    curve = pass_at_k_curve(data.rewards_by_task)
    for s in data.views["run_scores"]:
        scored = sum(len(r) for r in data.rewards_by_task.values())
        console.print(Padding(_pairs([
            ("env / model", f"{s['env']} / {s['model']}"),
            ("rollouts", f"{s['rollouts']}: {s['completed']} completed, {s['failed']} failed, {s['running']} running, "
                         f"{s['masked']} masked"),
            ("mean reward", f"{fmt(s['mean_reward'])} over {scored} scored rollouts"),
            ("pass@k", f"{pass_at_k_summary(curve)} ({len(data.rewards_by_task)} tasks, unbiased estimator)"),
            ("solved tasks", "-" if s["pass_at_k"] is None else  # a share, not a count
             f"{100 * s['pass_at_k']:.0f}% (share of tasks with a sample of reward >= 1)"),
        ]), (0, 0, 0, INDENT)))
    for lat in data.views["latency_percentiles"]:
        _heading(console, "Latency (latency_percentiles)")
        console.print(Padding(_pairs([("p50 / p90 / p99", f"{fmt(lat['p50_s'])} s / {fmt(lat['p90_s'])} s / "
                                                          f"{fmt(lat['p99_s'])} s")]), (0, 0, 0, INDENT)))


def render_failures(console: Console, data: RunData, linker: Linker) -> None:
    total = sum(int(r["n"]) for r in data.views["failure_counts"])
    _heading(console, f"Failures (failure_counts): {total} of {len(data.points)} rollouts")
    if not data.failures:
        console.print(" " * INDENT + "none")
        return
    current = None
    for row in data.failures:
        if row["failure_type"] != current:
            current = row["failure_type"]
            more = f", {row['messages']} distinct messages" if row["messages"] > 1 else ""
            noun = "rollout" if row["type_n"] == 1 else "rollouts"
            console.print(Text(" " * INDENT + f"{current}: {row['type_n']} {noun}{more}", style="bold"),
                          soft_wrap=True)
        # A grid, so a wrapped message hangs under its first line instead of under the count.
        grid = Table.grid(padding=(0, 2))
        grid.add_column(no_wrap=True, style="bold", min_width=INDENT)
        grid.add_column(overflow="fold")
        grid.add_row(f"{row['n']}x", row["failure_message"] or "(no message)")
        console.print(Padding(grid, (0, 0, 0, INDENT * 2)))
        for rid in row["examples"] or ():
            _link_line(console, rid, linker, INDENT * 4)


def render_comparison(console: Console, c: Comparison) -> None:
    _heading(console, f"Comparison: {c.label_b} (B) minus {c.label_a} (A)")
    ci = "-" if c.low is None else f"[{signed(c.low)}, {signed(c.high)}]"
    console.print(Padding(_pairs([
        ("mean reward A", f"{fmt(c.mean_a)} ({c.label_a})"),
        ("mean reward B", f"{fmt(c.mean_b)} ({c.label_b})"),
        ("B - A", signed(c.diff)),
        (f"{c.confidence:.0%} CI", ci),
        ("method", c.detail),
    ]), (0, 0, 0, INDENT)))


def render_report(console: Console, runs: Sequence[RunData], linker: Linker, comparison: Comparison | None = None
                  ) -> None:
    for data in runs:
        render_scores(console, data)
        render_failures(console, data, linker)
        console.print()
    if comparison is not None:
        render_comparison(console, comparison)


# -- gymflow show --------------------------------------------------------------------------------------------

TEXT_LIMIT = 600
ARGS_LIMIT = 300
DETAILS_LIMIT = 1500


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, list):  # content parts: their text, an image as its type (not its base64)
        return shown_content(content) or ""
    return content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)


def _message(console: Console, i: int, m: dict[str, Any], limit: int | None) -> None:
    role = str(m.get("role", "?"))
    head = Text(f"[{i}] {role}", style="bold cyan")
    if role == "tool":
        name = f"{m['name']} " if m.get("name") else ""
        head.append(f"  {name}(call {m.get('tool_call_id') or '?'})", style="cyan")
    console.print(head, soft_wrap=True)
    body = Padding(Text(abbreviate(_content_text(m.get("content")), limit)), (0, 0, 0, INDENT * 2))
    if m.get("reasoning_content"):
        console.print(Padding(Text("reasoning: " + abbreviate(str(m["reasoning_content"]), limit), style="dim"),
                              (0, 0, 0, INDENT * 2)))
    if m.get("content") not in (None, ""):
        console.print(body)
    for call in m.get("tool_calls") or ():
        fn = call.get("function") or {}
        line = Text("-> tool call ", style="magenta")
        line.append(str(fn.get("name")), style="bold magenta")
        line.append(f" (call {call.get('id')})  ")
        line.append(abbreviate(str(fn.get("arguments", "")), None if limit is None else ARGS_LIMIT))
        console.print(Padding(line, (0, 0, 0, INDENT * 2)))


def _generations(console: Console, gens: Sequence[dict[str, Any]]) -> None:
    _heading(console, f"Generations ({len(gens)}, one per turn; token counts from the endpoint)")
    if not gens:
        console.print(" " * INDENT + "none recorded")
        return
    # Short headers and short values: eight columns fit 80 without any being cut.
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    for name, justify in (("turn", "right"), ("try", "right"), ("finish", "left"), ("prompt", "right"),
                          ("compl", "right"), ("secs", "right"), ("token ids", "left"), ("logprobs", "left")):
        table.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for g in gens:
        ids = (f"{g['prompt_token_ids_n']}+{g['generation_token_ids_n']}"
               if g["has_prompt_token_ids"] or g["has_generation_token_ids"] else "no")
        table.add_row(str(g["turn"]), str(g["attempt"]), g["finish_reason"] or "-", str(g["prompt_tokens"]),
                      str(g["completion_tokens"]), fmt(g["latency_s"], 3), ids,
                      str(g["log_probs_n"]) if g["has_log_probs"] else "no")
    console.print(Padding(table, (0, 0, 0, INDENT)))


def render_rollout(console: Console, r: dict[str, Any], linker: Linker, *, full: bool = False) -> None:
    """Everything about one rollout: summary, failure, transcript, per-turn generations, score details."""
    limit = None if full else TEXT_LIMIT
    _heading(console, f"Rollout {r['id']}")
    url = linker(r["id"])
    console.print(Padding(_pairs([
        ("run / task / sample", f"{r['run_id']} / {r['task_id']} / {r['sample_index']}"),
        ("env / model", f"{r['env']} / {r['model']}"),
        ("status", f"{r['status']}, reward {fmt(r['reward'])}" + (", masked" if r["masked"] else "")),
        ("turns", f"{r['turns']} ({r['tool_calls']} tool calls, {r['attempts']} generation attempts)"),
        ("tokens", f"{r['prompt_tokens']} prompt, {r['completion_tokens']} completion"),
        ("latency", f"{fmt(r['latency_s'])} s"),
        ("started", str(r["started_at"])),
        ("finished", str(r["finished_at"] or "-")),
    ]), (0, 0, 0, INDENT)))
    if url:
        console.print(Text(" " * INDENT + "Temporal UI  ").append(url, style=f"link {url}"), soft_wrap=True)
    if r["failure_type"] or r["failure_message"]:
        _heading(console, "Failure")
        failure = Text(f"{r['failure_type'] or 'none'}: ", style="bold red")
        failure.append(r["failure_message"] or "(no message)")
        console.print(Padding(failure, (0, 0, 0, INDENT)))
    transcript = r["transcript"] or []
    live = " so far: the episode is running (the newest messages stored)" if r.get("live") else ""
    _heading(console, f"Transcript ({len(transcript)} messages{live})")
    for i, m in enumerate(transcript):
        _message(console, i, m if isinstance(m, dict) else {"content": m}, limit)
    _generations(console, r["generations"])
    _heading(console, "Score details")
    details = json.dumps(r["score_details"] or {}, indent=2, ensure_ascii=False, default=str)
    console.print(Padding(Text(abbreviate(details, None if full else DETAILS_LIMIT)), (0, 0, 0, INDENT)))
