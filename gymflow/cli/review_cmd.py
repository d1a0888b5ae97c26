"""`gymflow review`: label rollouts by hand (the verifier right or wrong, the reward you would give, tags, a
comment), pick what to label next, and measure each environment's verifier against its reviewers."""

from __future__ import annotations

import getpass
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gymflow.cli.common import config_option, run, settings_or_exit
from gymflow.cli.progress import log_console
from gymflow.kernel.config import Settings
from gymflow.kernel.connect import resolve_addresses, startup_wait_s
from gymflow.kernel.store import reviews
from gymflow.kernel.store.db import migrate_when_reachable
from gymflow.kernel.store.direct import DirectPool
from gymflow.kernel.store.repo import Conn

REVIEWER_ENV = "GYMFLOW_REVIEWER"
T = TypeVar("T")


def default_reviewer() -> str:
    return os.environ.get(REVIEWER_ENV) or getpass.getuser()


@asynccontextmanager
async def _connection(settings: Settings) -> AsyncIterator[Conn]:
    url = resolve_addresses(settings)[1]
    await migrate_when_reachable(url, wait_s=startup_wait_s())
    pool = DirectPool(url, max_size=1)
    try:
        async with pool.connection() as conn:
            yield conn
    finally:
        await pool.close()


def _with_conn(settings: Settings, fn: Callable[[Conn], Awaitable[T]]) -> T:
    async def go() -> T:
        async with _connection(settings) as conn:
            return await fn(conn)

    try:
        return run(go())
    except (reviews.ReviewError, LookupError) as e:
        raise click.ClickException(str(e)) from None


@click.group()
def review() -> None:
    """Human review of rollouts: `queue` what to label, `mark` one, `report` the verifier's agreement, `export`."""


reviewer_option = click.option("--reviewer", default=None, metavar="NAME",
                               help=f"Who labels (default ${REVIEWER_ENV}, else your user name)")


@review.command("queue")
@click.argument("run_id")
@click.option("--kind", type=click.Choice(reviews.QUEUES), default="random", show_default=True,
              help="random: scored rollouts in a fixed random order; disagreements: samples of tasks whose samples "
                   "got different rewards; near-threshold: rewards within --margin of --threshold; failure: "
                   "rollouts failed or masked with --failure-type")
@click.option("-n", default=20, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--failure-type", default=None, help="With --kind failure (docs/failures.md's types)")
@click.option("--threshold", default=0.5, show_default=True, type=float)
@click.option("--margin", default=0.25, show_default=True, type=float)
@reviewer_option
@config_option
def queue_cmd(run_id: str, kind: str, n: int, failure_type: str | None, threshold: float, margin: float,
              reviewer: str | None, config_path: str | None) -> None:
    """The next rollouts of RUN for you to label (ones you have not labelled yet)."""
    who = reviewer or default_reviewer()
    rows = _with_conn(settings_or_exit(config_path), lambda c: reviews.queue(
        c, run_id, kind, who, n=n, failure_type=failure_type, threshold=threshold, margin=margin, seed=who))
    if not rows:
        click.echo(f"run {run_id}: nothing left to review in queue {kind} for {who}")
        return
    table = Table("rollout", "env", "status", "reward", "failure")
    for r in rows:
        reward = "masked" if r["masked"] else "-" if r["reward"] is None else f"{r['reward']:g}"
        table.add_row(escape(r["id"]), escape(r["env"]), r["status"], reward, escape(r["failure_type"] or ""))
    log_console().print(table)
    click.echo("`gymflow show ID` to read one, then `gymflow review mark ID --verdict right|wrong`")


@review.command("mark")
@click.argument("rollout_id")
@click.option("--verdict", type=click.Choice(reviews.VERDICTS), required=True,
              help="Is the verifier's score right?")
@click.option("--reward", type=float, default=None, help="The reward you would give")
@click.option("--tag", "tags", multiple=True, help="A tag (repeatable)")
@click.option("--comment", default=None)
@reviewer_option
@config_option
def mark(rollout_id: str, verdict: str, reward: float | None, tags: tuple[str, ...], comment: str | None,
         reviewer: str | None, config_path: str | None) -> None:
    """Label ROLLOUT_ID. Stored beside the verifier's score, never over it; your newest label of a rollout counts."""
    label = reviews.Label(rollout_id=rollout_id, reviewer=reviewer or default_reviewer(), verdict=verdict,
                          reward=reward, tags=tags, comment=comment)
    review_id = _with_conn(settings_or_exit(config_path), lambda c: reviews.add_review(c, label))
    click.echo(f"review {review_id}: {rollout_id} marked {verdict} by {label.reviewer}")


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


@review.command("report")
@click.argument("run_id")
@click.option("--threshold", default=1.0, show_default=True, type=float, help="A pass is reward >= this")
@click.option("--json", "as_json", is_flag=True)
@config_option
def report_cmd(run_id: str, threshold: float, as_json: bool, config_path: str | None) -> None:
    """Each environment's verifier against its reviewers: agreement, precision and recall of its passes, and
    example rollouts of each kind of disagreement."""
    rows = _with_conn(settings_or_exit(config_path), lambda c: reviews.agreement(c, run_id, threshold=threshold))
    if as_json:
        click.echo(json.dumps(rows, default=str, indent=2))
        return
    if not rows:
        click.echo(f"run {run_id}: no reviews yet (`gymflow review queue {run_id}`)")
        return
    console = log_console(Console(highlight=False))
    for r in rows:
        console.print(f"[bold]{escape(r['env'])}[/bold]: {r['labels']} labels of {r['rollouts']} rollouts by "
                      f"{r['reviewers']} reviewer(s): verifier right {r['agree']}, wrong {r['disagree']}, unsure "
                      f"{r['unsure']} (masked {r['masked']})")
        console.print(f"  passes (reward >= {threshold:g}): precision {_fmt(r['precision'])}, recall "
                      f"{_fmt(r['recall'])}  (tp {r['tp']}, fp {r['fp']}, fn {r['fn']}, tn {r['tn']})")
        for what, key in (("passed, reviewers say fail", "fp_examples"), ("failed, reviewers say pass", "fn_examples")):
            if r[key]:
                console.print(f"  {what}: " + ", ".join(escape(x) for x in r[key]))
        comments = [c for c in r["wrong_comments"] or [] if c]
        if comments:
            console.print("  why (comments on 'wrong'): " + " | ".join(escape(c[:120]) for c in comments))


@review.command("export")
@click.argument("run_id")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True)
@config_option
def export_cmd(run_id: str, out: Path, config_path: str | None) -> None:
    """Every reviewer's newest label of RUN's rollouts as JSONL, keyed by rollout_id (as `gymflow export` rows
    are), with the verifier's reward beside each."""
    rows = _with_conn(settings_or_exit(config_path), lambda c: reviews.labels(c, run_id))
    tmp = out.with_name(out.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(_jsonable(r), ensure_ascii=False) + "\n")
    tmp.replace(out)
    click.echo(f"{len(rows)} labels -> {out}")


def _jsonable(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in row.items()}
