"""`gymflow report RUN [--vs RUN_B] [--html FILE]`: scores, pass@k, latency, the top failure messages with
example rollouts and Temporal UI links, and optionally a comparison and a self-contained HTML page."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console

from gymflow.cli.common import config_option, run, settings_or_exit
from gymflow.kernel.store.reports import recent_runs
from gymflow.reports.data import UI_URL_ENV, Linker, RunData, load_run, make_linker, store_session
from gymflow.reports.stats import Comparison, compare_runs
from gymflow.reports.text import render_report

ui_url_option = click.option("--ui-url", default=None, metavar="URL",
                             help=f"Temporal UI base for links, e.g. http://localhost:8233 (default: ${UI_URL_ENV}, "
                                  "else the one `gymflow up` started)")


def unknown_run_message(run_id: str, known: list[str]) -> str:
    hint = f" (recent runs: {', '.join(known)})" if known else " (no runs are recorded in this database)"
    return f"no rollouts recorded for run {run_id!r}{hint}"


async def _load(config_path: str | None, run_ids: list[str], top: int, examples: int, ui_url: str | None,
                score: str = "latest") -> tuple[list[RunData], Linker]:
    settings = settings_or_exit(config_path)
    out = []
    async with store_session(settings, on_wait=lambda m: click.echo(m, err=True)) as session:
        for run_id in run_ids:
            try:
                data = await load_run(session, run_id, per_type=top, examples=examples, score=score)
            except LookupError as e:
                raise click.ClickException(str(e)) from None
            if data is None:
                raise click.ClickException(unknown_run_message(run_id, await recent_runs(session)))
            out.append(data)
    return out, make_linker(settings, ui_url)


@click.command()
@click.argument("run_id")
@click.option("--vs", "vs_run", default=None, metavar="RUN_B",
              help="Compare with RUN_B: mean reward of RUN_B minus RUN_ID, with a 95% confidence interval")
@click.option("--html", "html_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Also write a self-contained HTML report (plots and tables) to this file")
@click.option("--top", default=3, show_default=True, type=click.IntRange(1),
              help="Most frequent messages shown per failure type")
@click.option("--examples", default=3, show_default=True, type=click.IntRange(1),
              help="Example rollout ids shown per message")
@click.option("--score", default="latest", show_default=True, metavar="VERSION",
              help="Which scores: latest (the newest finished `gymflow rescore`, else the collect's own), "
                   "collected, or a score version's name")
@ui_url_option
@config_option
def report(run_id: str, vs_run: str | None, html_path: str | None, top: int, examples: int, score: str,
           ui_url: str | None, config_path: str | None) -> None:
    """Summarise RUN from Postgres: scores and pass@k, latency, failures by type with their most frequent
    messages, example rollout ids and Temporal UI links (`gymflow show ID` prints one rollout)."""
    ids = [run_id] + ([vs_run] if vs_run else [])
    runs, linker = run(_load(config_path, ids, top, examples, ui_url, score))
    comparison: Comparison | None = None
    if vs_run:
        comparison = compare_runs(runs[0].rewards_by_task, runs[1].rewards_by_task, label_a=run_id, label_b=vs_run)
    render_report(Console(), runs, linker, comparison)
    if html_path:
        from gymflow.reports.html import render_html  # lazy: matplotlib takes a second to import

        Path(html_path).write_text(render_html(runs, linker, comparison), encoding="utf-8")
        click.echo(f"HTML report written to {html_path}")
