"""`gymflow rescore RUN`: verify a run's stored episodes again into a new score version, and compare versions."""

from __future__ import annotations

import json
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gymflow.cli.common import config_option, run, settings_or_exit
from gymflow.cli.progress import log_console
from gymflow.kernel.config import Settings
from gymflow.kernel.connect import resolve_addresses
from gymflow.kernel.errors import GymflowError
from gymflow.kernel.store import scores
from gymflow.kernel.store.direct import DirectPool

SHOWN_FLIPS = 20


def parse_overrides(values: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """`ENV.KEY=VALUE` pairs into {env: {key: value}}. VALUE is JSON where it parses as JSON (30, 0.5, true, null,
    "quoted", [1, 2]), else the text itself: `no` stays the string "no" (YAML would read it as false)."""
    out: dict[str, dict[str, Any]] = {}
    for text in values:
        target, sep, raw = text.partition("=")
        env, dot, key = target.partition(".")
        if not sep or not dot or not env or not key:
            raise click.BadParameter(f"{text!r}: expected ENV.KEY=VALUE, e.g. math_with_judge.should_use_judge=false",
                                     param_hint="--option")
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        out.setdefault(env, {})[key] = value
    return out


def _label(version: scores.ScoreVersion | None) -> str:
    return scores.COLLECTED if version is None else version.name


async def _flips(settings: Settings, run_id: str, before: str, after: str) -> tuple[str, str, int, list[Any]]:
    pool = DirectPool(resolve_addresses(settings)[1], max_size=2)
    try:
        async with pool.connection() as conn:
            a, b = await scores.resolve(conn, run_id, before), await scores.resolve(conn, run_id, after)
            total, rows = await scores.flips(conn, run_id, a.id if a else None, b.id if b else None, SHOWN_FLIPS)
        return _label(a), _label(b), total, rows
    finally:
        await pool.close()


async def _versions(settings: Settings, run_id: str) -> list[scores.ScoreVersion]:
    pool = DirectPool(resolve_addresses(settings)[1], max_size=2)
    try:
        async with pool.connection() as conn:
            return await scores.versions(conn, run_id)
    finally:
        await pool.close()


def _print_flips(console: Console, run_id: str, flips: tuple[str, str, int, list[Any]]) -> None:
    before, after, total, rows = flips
    console.print(f"run {run_id}: {total} rollout(s) changed reward or mask from {before} to {after}", highlight=False)
    if not rows:
        return
    table = Table("rollout", before, after, "why (now)")
    for rid, ra, rb, ma, mb, _fa, fb, mb_msg in rows:
        def cell(reward: float | None, masked: bool) -> str:
            return "masked" if masked else "-" if reward is None else f"{reward:g}"

        table.add_row(escape(rid), cell(ra, ma), cell(rb, mb), escape(f"{fb}: {mb_msg or ''}" if fb else ""))
    console.print(table)
    if total > len(rows):
        console.print(f"... and {total - len(rows)} more (SQL: the `rescored` table)", highlight=False)


@click.command()
@click.argument("run_id")
@click.option("--name", default=None, help="The score version's name (default v<N>); an unfinished one of that "
                                           "name is resumed.")
@click.option("--option", "options", multiple=True, metavar="ENV.KEY=VALUE",
              help="An environment option for this rescore, over the config's (repeatable).")
@click.option("--concurrency", type=click.IntRange(1, 256), default=4, show_default=True,
              help="Episodes verified at once.")
@click.option("--list", "list_versions", is_flag=True, help="List the run's score versions and exit.")
@click.option("--diff", "diff", is_flag=True, help="Only compare two versions (--from, --to) and exit.")
@click.option("--from", "before", default=scores.COLLECTED, show_default=True, help="With --diff: the base version.")
@click.option("--to", "after", default=scores.LATEST, show_default=True, help="With --diff: the compared version.")
@config_option
def rescore(run_id: str, name: str | None, options: tuple[str, ...], concurrency: int, list_versions: bool,
            diff: bool, before: str, after: str, config_path: str | None) -> None:
    """Verify RUN's stored episodes again with the verifiers installed here (changed code or --option), into a new
    score version beside the collect's own, which is kept. Interrupted, run it again: it scores only what it had
    not stored. Then shows which rewards flipped. `gymflow report RUN --score NAME` reports a version."""
    from gymflow.rescore import rescore_run

    settings = settings_or_exit(config_path)
    console = log_console(Console(highlight=False))
    try:
        if list_versions:
            found = run(_versions(settings, run_id))
            table = Table("version", "ordinal", "scored", "finished", "verifiers", "options")
            table.add_row(scores.COLLECTED, "0", "-", "yes", "as collected", "as collected")
            for v in found:
                table.add_row(escape(v.name), str(v.ordinal), str(v.scored), "yes" if v.finished else "no",
                              escape(", ".join(f"{e} {i.get('source_sha256', '')}" for e, i in v.verifiers.items())),
                              escape(str(v.options)))
            console.print(table)
            return
        if not diff:
            overrides = parse_overrides(options)

            def progress(scored: int, already: int) -> None:
                if scored % 100 == 0:
                    console.print(f"  {scored + already} scored", highlight=False)

            result = run(rescore_run(settings, run_id, name=name, overrides=overrides, concurrency=concurrency,
                                     on_progress=progress))
            how = "resumed" if result.resumed else "new"
            console.print(f"run {run_id}: score version {result.version.name} ({how}): {result.scored} scored now, "
                          f"{result.already} before" + (f"; masked: {result.errors}" if result.errors else ""))
            before, after = scores.COLLECTED, result.version.name
        _print_flips(console, run_id, run(_flips(settings, run_id, before, after)))
    except (GymflowError, LookupError, ValueError) as e:
        raise click.ClickException(str(e)) from None
