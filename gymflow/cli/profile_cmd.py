"""`gymflow profile RUN` (the per-task reward profile, pass@k, majority@k, the tasks to keep) and `gymflow check
RUN` (post-collection health checks that exit 1 when one fails), both read from Postgres only."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import click

from gymflow.cli.common import config_option, run, settings_or_exit
from gymflow.cli.report_cmd import unknown_run_message
from gymflow.kernel.errors import GymflowError
from gymflow.kernel.store.reports import recent_runs
from gymflow.reports.data import store_session
from gymflow.reports.health import Check, run_checks
from gymflow.reports.profile import CATEGORIES, RunProfile, TaskRows, load_profile, rows_for_tasks, write_rows
from gymflow.reports.stats import PASS_THRESHOLD

LABELS = {"mixed": "mixed", "solved": "always solved", "unsolved": "never solved", "unscored": "unscored"}
SHOWN_IDS = 10


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _ids(ids: Sequence[str]) -> str:
    more = f", ... and {len(ids) - SHOWN_IDS} more" if len(ids) > SHOWN_IDS else ""
    return ", ".join(ids[:SHOWN_IDS]) + more


def _columns(rows: list[list[str]]) -> list[str]:
    """Left-aligned first column, right-aligned others, two spaces apart."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths,
                                                                                              strict=True)))
            for r in rows]


def profile_lines(p: RunProfile, limit: int) -> list[str]:
    t = p.totals()
    lines = [f"Profile of run {p.run_id}: {len(p.tasks)} tasks, {t['samples']} rollouts: {t['scored']} scored, "
             f"{t['masked']} masked, {t['failed']} failed, {t['running']} running",
             f"A sample passes at reward >= {p.threshold:g}; rates and rewards are over scored samples only "
             "(masked and failed ones are counted, never scored 0).", "",
             "Run: mean over the tasks with at least k scored samples"]
    lines += _columns([["k", "pass@k", "majority@k", "tasks"]] +
                      [[str(s.k), _fmt(s.pass_at_k), _fmt(s.majority_at_k), str(s.tasks)] for s in p.summary])
    lines += [f"  note: {n}" for n in p.notes]
    lines += ["", "Tasks by outcome (GRPO learns nothing from the always and never solved: zero-variance groups)"]
    for category in CATEGORIES:
        ids = p.by_category(category)
        if ids or category != "unscored":
            lines.append(f"  {LABELS[category]} ({len(ids)}){': ' + _ids(ids) if ids else ''}")
    shown = p.tasks if limit == 0 else p.tasks[:limit]
    more = f" (first {len(shown)} of {len(p.tasks)}; --limit 0 shows all)" if len(shown) < len(p.tasks) else ""
    lines += ["", f"Per task{more}"]
    head = ["task", "samples", "scored", "masked", "failed", "pass", "mean", "std", "min", "max",
            *(f"pass@{k}" for k in p.ks), *(f"maj@{k}" for k in p.ks)]
    body = [[x.task_id, str(x.samples), str(x.scored), str(x.masked), str(x.failed), _fmt(x.pass_rate),
             _fmt(x.mean), _fmt(x.std), _fmt(x.min), _fmt(x.max), *(_fmt(x.pass_at(k)) for k in p.ks),
             *(_fmt(x.majority_at(k)) for k in p.ks)] for x in shown]
    return lines + _columns([head, *body])


async def _profile(config_path: str | None, run_id: str, ks: Sequence[int], threshold: float,
                   keep: Sequence[str], out_tasks: str | None) -> tuple[RunProfile, TaskRows | None]:
    settings = settings_or_exit(config_path)
    async with store_session(settings, on_wait=lambda m: click.echo(m, err=True)) as session:
        profile = await load_profile(session, run_id, ks=ks, threshold=threshold)
        if profile is None:
            raise click.ClickException(unknown_run_message(run_id, await recent_runs(session)))
        t = profile.totals()
        if not t["scored"]:
            raise click.ClickException(
                f"run {run_id!r} has {t['samples']} rollouts but none completed with a reward ({t['failed']} failed, "
                f"{t['masked']} masked, {t['running']} running): nothing to profile; `gymflow report {run_id}` "
                "shows why they failed")
        rows = None
        if out_tasks:
            chosen = [x.task_id for x in profile.tasks if x.category in keep]
            rows = await rows_for_tasks(session, run_id, chosen)
    return profile, rows


@click.command()
@click.argument("run_id")
@click.option("--k", "ks", multiple=True, type=click.IntRange(1), metavar="K",
              help="pass@k and majority@k for this k (repeatable; default 1, 2, 4, ... and the most samples)")
@click.option("--threshold", default=PASS_THRESHOLD, show_default=True, type=float,
              help="A sample passes at reward >= THRESHOLD")
@click.option("--out-tasks", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Write the dataset rows of the tasks chosen by --keep to FILE (JSONL, ready for `gymflow collect`)")
@click.option("--keep", multiple=True, type=click.Choice(CATEGORIES), metavar="|".join(CATEGORIES),
              help="Which tasks --out-tasks writes (repeatable; default mixed: neither always nor never solved; "
                   "unscored: no sample got a reward)")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(0),
              help="Tasks shown in the per-task table (0: all; --json always has all)")
@click.option("--json", "as_json", is_flag=True, help="Print the profile as one JSON object")
@config_option
def profile(run_id: str, ks: tuple[int, ...], threshold: float, out_tasks: str | None, keep: tuple[str, ...],
            limit: int, as_json: bool, config_path: str | None) -> None:
    """Per-task reward profile of RUN: samples, scored / masked / failed counts, pass rate, reward mean, std
    (population), min and max over the scored samples, pass@k (unbiased: 1 - C(n-c, k) / C(n, k) over a task's n
    scored samples, c passing) and majority@k (1 when more than half of the task's first k scored samples by
    sample index pass, so a tie is 0), each averaged over the tasks with at least k scored samples; and the tasks
    always solved, never solved and mixed. --out-tasks writes the chosen tasks' stored rows, which `gymflow
    collect` (or `load_jsonl`) reads back as the same tasks."""
    if not math.isfinite(threshold):
        raise click.BadParameter("must be a finite number", param_hint="--threshold")
    if keep and not out_tasks:
        raise click.UsageError("--keep chooses what --out-tasks writes; give --out-tasks FILE too")
    prof, rows = run(_profile(config_path, run_id, ks, threshold, keep or ("mixed",), out_tasks))
    written: dict[str, Any] | None = None
    if out_tasks and rows is not None:
        try:
            write_rows(out_tasks, rows.rows)
        except GymflowError as e:
            raise click.ClickException(str(e)) from None
        written = {"path": out_tasks, "rows": len(rows.rows), "keep": list(keep or ("mixed",)),
                   "missing": rows.missing, "not_exact": rows.not_exact}
    if as_json:
        click.echo(json.dumps({**prof.to_json(), **({"out_tasks": written} if written else {})}))
    else:
        click.echo("\n".join(profile_lines(prof, limit)))
    if written:
        def say(message: str) -> None:
            click.echo(message, err=as_json)  # with --json stdout stays one JSON object

        say(f"\nWrote {written['rows']} task rows ({', '.join(written['keep'])}) to {out_tasks}")
        if rows and rows.missing:
            say(f"  {len(rows.missing)} chosen task(s) have no stored row in this run and were not written: "
                f"{_ids(rows.missing)}")
        if rows and rows.not_exact:
            say(f"  {len(rows.not_exact)} row(s) do not load back exactly as their task (a setting no row format "
                f"holds, e.g. sampling stop): {_ids(rows.not_exact)}")


# ---- check ---------------------------------------------------------------------------------------------------


def check_lines(run_id: str, checks: Sequence[Check]) -> list[str]:
    tally = {v: sum(1 for c in checks if c.verdict == v) for v in ("fail", "warn", "ok", "skip")}
    lines = [f"Health of run {run_id}: {len(checks)} checks: " + ", ".join(f"{n} {v}" for v, n in tally.items())]
    for c in checks:
        rate = f" ({c.n / c.of:.1%})" if c.of else ""
        lines.append(f"{c.verdict.upper():<4}  {c.id}: {c.n} of {c.of} {c.unit}{rate}  [{c.threshold.describe()}]")
        lines.append(f"      {c.title}")
        if c.counts:
            lines.append("      " + ", ".join(f"{k} {v}" for k, v in c.counts.items()))
        if c.detail:
            lines.append(f"      {c.detail}")
        if c.examples:
            lines.append("      e.g. " + "  ".join(c.examples))
    return lines


async def _check(config_path: str | None, run_id: str, threshold: float) -> list[Check]:
    settings = settings_or_exit(config_path)
    async with store_session(settings, on_wait=lambda m: click.echo(m, err=True)) as session:
        checks = await run_checks(session, run_id, threshold=threshold)
        if checks is None:
            raise click.ClickException(unknown_run_message(run_id, await recent_runs(session)))
    return checks


@click.command("check")
@click.argument("run_id")
@click.option("--threshold", default=PASS_THRESHOLD, show_default=True, type=float,
              help="A sample passes at reward >= THRESHOLD (for the never-solved count)")
@click.option("--json", "as_json", is_flag=True, help="Print the checks as one JSON object")
@config_option
def check(run_id: str, threshold: float, as_json: bool, config_path: str | None) -> None:
    """Health checks of RUN after a collection, each with a stable id, a verdict (ok, warn, fail; skip when
    nothing could be checked) from its rate against stated thresholds, counts and up to 3 example rollout ids:
    hollow_turns, zero_completion_tokens, truncated_replies, runaway_repetition, tool_call_parse_failures,
    token_drift, tasks_failing_every_sample, duplicate_rollout_identities, duplicate_prompts, failure_share.
    Exits 1 when any check fails, so it can gate a pipeline (docs/operations.md has each threshold)."""
    if not math.isfinite(threshold):
        raise click.BadParameter("must be a finite number", param_hint="--threshold")
    checks = run(_check(config_path, run_id, threshold))
    if as_json:
        click.echo(json.dumps({"run_id": run_id, "failed": any(c.verdict == "fail" for c in checks),
                               "checks": [c.to_json() for c in checks]}))
    else:
        click.echo("\n".join(check_lines(run_id, checks)))
    if any(c.verdict == "fail" for c in checks):
        raise SystemExit(1)
