"""`gymflow export RUN --format rl|sft|dpo --out FILE`: training data from a run's stored rollouts."""

from __future__ import annotations

from pathlib import Path

import click

from gymflow.cli.common import config_option, run, settings_or_exit
from gymflow.reports.data import store_session
from gymflow.training.export import FORMATS, SFT_DEFAULT_MIN_REWARD, ExportSummary, export_run


async def _export(config_path: str | None, run_id: str, fmt: str, out: Path, min_reward: float | None,
                  include_masked: bool) -> ExportSummary:
    settings = settings_or_exit(config_path)
    async with store_session(settings, on_wait=lambda m: click.echo(m, err=True)) as session:
        try:
            return await export_run(session, run_id, fmt, out, min_reward=min_reward, include_masked=include_masked)
        except ValueError as e:
            raise click.ClickException(str(e)) from None


@click.command()
@click.argument("run_id")
@click.option("--format", "fmt", type=click.Choice(FORMATS), required=True,
              help="rl: token-exact sequences with loss mask and logprobs; sft: chats of rollouts at or above "
                   "--min-reward; dpo: best vs worst sample of each task (ties skipped)")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="output file: .parquet (row-group batches) or .jsonl")
@click.option("--min-reward", type=float, default=None,
              help=f"keep rollouts with reward >= this (rl, sft; sft default {SFT_DEFAULT_MIN_REWARD})")
@click.option("--include-masked", is_flag=True, help="keep masked (unscorable) rollouts too (rl, sft)")
@config_option
def export(run_id: str, fmt: str, out: Path, min_reward: float | None, include_masked: bool,
           config_path: str | None) -> None:
    """Write RUN_ID's rollouts as training data that `datasets`, TRL and NeMo RL read as they are.
    Failed and masked rollouts are left out by default; the summary line counts what was left out and why."""
    summary = run(_export(config_path, run_id, fmt, out, min_reward, include_masked))
    click.echo(summary.line())
