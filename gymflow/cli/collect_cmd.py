"""`gymflow collect`: run a dataset `n` times per task and show progress; rerunning resumes."""

from __future__ import annotations

import shlex
from contextlib import aclosing
from pathlib import Path

import click
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

from gymflow.cli.common import config_option, run, settings_or_exit, setup_logging
from gymflow.cli.probe import judge_models, probe_models
from gymflow.cli.progress import Tally, log_console, progress_bar, summary_table
from gymflow.client import GymflowClient, check_collectable
from gymflow.data.datasets import grouped, load_jsonl
from gymflow.kernel.config import Settings
from gymflow.kernel.errors import GymflowError
from gymflow.kernel.names import generate_queue
from gymflow.kernel.wire import SamplingParams
from gymflow.workers.health import idle_pools, pooled_models


def default_run_id(dataset: str, env: str | None, model: str, n: int) -> str:
    """Stable by default, so that running the same command again resumes the same run."""
    return f"{Path(dataset).stem}-{env or 'mixed'}-{model}-n{n}"


async def collect_dataset(settings: Settings, dataset: str, *, env: str | None, model: str, n: int, run_id: str,
                          sampling: SamplingParams | None = None, max_turns: int | None = None,
                          retry_failed: bool = False, max_in_flight: int = 1000,
                          console: Console | None = None, probe: bool = True) -> Tally:
    console = log_console(console)
    recorded: dict[str, int] = {}
    tasks, errors = load_jsonl(dataset, env=env, samples=recorded)
    if recorded and max(recorded.values()) > n:  # a rollout file with repeats, collected with fewer samples
        console.print(f"note: {dataset} holds up to {max(recorded.values())} recorded samples per task; -n {n} "
                      f"replays the first {n} of each", highlight=False)
    for line in grouped(errors):  # one line per kind of mistake, not one per row
        console.print(f"[red]skipped[/red] {escape(line)}", highlight=False)
    if not tasks:
        raise click.ClickException(f"{dataset}: no valid rows")
    try:  # before connecting: nothing is started and no run row is written for a typo
        check_collectable(settings, {t.env for t in tasks}, model, run_id)
    except GymflowError as e:
        raise click.ClickException(str(e)) from None
    # The policy and the judges of these environments: a dead endpoint fails (or masks) every rollout. The keys are
    # the workers' (a 401 for a key unset here proves nothing).
    wanted = [model, *judge_models(settings, {t.env for t in tasks})]
    if probe and (problems := await probe_models(settings, wanted, keys_elsewhere=True)):
        raise click.ClickException("\n".join(problems) + "\nnothing was started (--no-probe starts anyway)")

    def notice(message: str) -> None:
        console.print(f"[yellow]{escape(message)}[/yellow]", highlight=False)

    client = await GymflowClient.connect(settings, on_notice=notice)
    try:
        for queue in await idle_pools(client.temporal, pooled_models(settings, [model])):
            if queue == generate_queue(model):
                console.print("[yellow]warning[/yellow]: " + escape(
                    f"no generate worker serves model {model!r} (task queue {queue!r}); its rollouts will wait until "
                    f"one starts (`gymflow worker --pool generate --models {model}`) or their timeouts end them"),
                    highlight=False)
                continue
            console.print(f"[yellow]warning[/yellow]: no worker polls task queue {queue!r}; its rollouts will wait "
                          "until a worker starts (`gymflow worker --pool ...`) or their timeouts end them")
        envs = env or ",".join(sorted({t.env for t in tasks}))
        await client.record_run(run_id, env=envs, model=model, dataset=str(dataset), n=n,
                                dataset_errors=[str(e) for e in errors])
        tally = Tally(total=len(tasks) * n, skipped=len(errors))
        with progress_bar(console) as bar:
            job = bar.add_task(run_id, total=tally.total, stats="")
            # aclosing: on any error the in-flight waits are cancelled and awaited here, not at exit.
            async with aclosing(client.collect(run_id, tasks, n=n, model=model, sampling=sampling,
                                               max_turns=max_turns, retry_failed=retry_failed,
                                               max_in_flight=max_in_flight)) as results:
                async for result in results:
                    tally.add(result)
                    if result.outcome == "rejected":
                        console.print(f"[red]rejected[/red] {result.summary.rollout_id}: "
                                      f"{escape(result.summary.failure_message or '')}", highlight=False)
                    bar.update(job, advance=1, stats=tally.line())
        console.print(summary_table(run_id, tally))
        if tally.failed or tally.masked:
            console.print(f"failure messages, example rollouts and their Temporal UI links: "
                          f"[bold]gymflow report {escape(run_id)}[/bold]; one rollout: gymflow show ROLLOUT_ID")
        return tally
    finally:
        await client.close()


@click.command()
@click.argument("dataset", type=click.Path(exists=True, dir_okay=False))
@click.option("--env", "env_name", default=None,
              help="Environment for every row (see `gymflow env list`); default: each row's `env` field.")
@click.option("--model", default="policy", show_default=True, help="Model name from the config's `models`.")
@click.option("-n", "--samples", "n", type=click.IntRange(min=1), default=1, show_default=True,
              help="Samples per task (a GRPO group).")
@click.option("--run-id", default=None, help="Default: derived from dataset, env, model and n (resumable).")
@click.option("--max-turns", type=click.IntRange(min=1), default=None)
@click.option("--temperature", type=float, default=None)
@click.option("--max-tokens", type=int, default=None)
@click.option("--retry-failed", is_flag=True, help="Run again the rollouts of this run that failed.")
@click.option("--max-in-flight", type=click.IntRange(min=1), default=1000, show_default=True)
@click.option("--no-probe", is_flag=True, help="Start even if the model endpoint does not answer its probe.")
@config_option
def collect(dataset: str, env_name: str | None, model: str, n: int, run_id: str | None, max_turns: int | None,
            temperature: float | None, max_tokens: int | None, retry_failed: bool, max_in_flight: int,
            no_probe: bool, config_path: str | None) -> None:
    """Collect rollouts for every task in DATASET (JSONL, NeMo Gym rows load unchanged).

    Rows that do not load are reported by line and skipped. If Temporal restarts mid-run, collect waits for
    it (up to $GYMFLOW_RECONNECT_WAIT_S, default 600 s) and re-attaches to the same rollouts."""
    setup_logging(False)
    settings = settings_or_exit(config_path)
    sampling = None
    if temperature is not None or max_tokens is not None:
        given = {k: v for k, v in (("temperature", temperature), ("max_tokens", max_tokens)) if v is not None}
        try:  # validated as the config's own values are (a model_copy would skip the bounds)
            sampling = type(settings.rollout.sampling).model_validate({**settings.rollout.sampling.model_dump(),
                                                                       **given})
        except ValidationError as e:
            raise click.BadParameter(e.errors()[0]["msg"], param_hint="--temperature/--max-tokens") from None
    rid = run_id or default_run_id(dataset, env_name, model, n)
    again = rerun_command(dataset, env_name, model, n, rid, config_path)
    try:
        tally = run(collect_dataset(settings, dataset, env=env_name, model=model, n=n, run_id=rid, sampling=sampling,
                                    max_turns=max_turns, retry_failed=retry_failed, max_in_flight=max_in_flight,
                                    probe=not no_probe))
    except KeyboardInterrupt:  # the rollouts are Temporal's, not this process's: say so instead of "Aborted!"
        click.echo(f"\nstopped waiting; the rollouts of run {rid!r} keep running in Temporal. "
                   f"Rerun to re-attach: {again}", err=True)
        raise SystemExit(130) from None
    if tally.failed:
        for line in retry_hint(tally.failed, rid, again, config_path):
            click.echo(line, err=True)
        raise SystemExit(1)


def rerun_command(dataset: str, env: str | None, model: str, n: int, run_id: str, config: str | None) -> str:
    """The command that re-attaches to this run (the same run id, hence the same rollouts)."""
    args = ["gymflow", "collect", dataset, *(["--env", env] if env else []), "--model", model, "-n", str(n),
            "--run-id", run_id, *(["--config", config] if config else [])]
    return shlex.join(args)


def retry_hint(failed: int, run_id: str, again: str, config: str | None = None) -> list[str]:
    """What to run after failures: a rerun shows the same failures again unless told to retry them."""
    resume = shlex.join(["gymflow", "resume", run_id, *(["--config", config] if config else [])])
    return [f"{failed} rollout{'s' if failed != 1 else ''} failed; to run them again (after fixing the cause):",
            f"  {again} --retry-failed      # from the start",
            f"  {resume}      # from the last step each one stored"]
