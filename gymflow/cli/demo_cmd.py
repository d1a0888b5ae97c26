"""`gymflow demo`: start the embedded stack and every pool, collect the single-tool example, show what came of it
(the best and the worst rollout's transcript, the run report, the next three commands), stop (`--keep`: at Ctrl-C).

The model is, in order: the scripted server (`--scripted`), the local SmolLM2-135M server (`--local-model`, or when
no `models.policy` is configured: gymflow.cli.demo_models), else `models.policy` from the config."""

from __future__ import annotations

import asyncio
import json
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
import httpx
from rich.console import Console

from gymflow.cli.collect_cmd import collect_dataset
from gymflow.cli.common import config_option, settings_or_exit, setup_logging
from gymflow.cli.demo_models import LOCAL_MAX_TOKENS, Policy, generated_config, model_options, policy_model
from gymflow.cli.progress import Tally
from gymflow.embedded import embedded_pools, wait_for_pools
from gymflow.kernel.config import ModelConfig, Settings
from gymflow.kernel.wire import shown_content

EXAMPLE = Path(__file__).resolve().parents[2].parent / "shared/data/nemo_gym/example_single_tool_call/example.jsonl"
# Transcripts in the demo's output are a glance: each message cut to this many characters and lines
# (`gymflow show ID` prints all of it).
MESSAGE_CHARS = 300
SYSTEM_CHARS = 120
MESSAGE_LINES = 6
ARGS_CHARS = 200
# Off a terminal (a log, a pipe, CI) rich lays out at 80 columns and cuts the progress line there; nothing reads a
# log at a width, so no cut at all, in effect. At a terminal its width holds.

__all__ = ["LOCAL_MAX_TOKENS", "demo", "next_steps", "transcript_lines"]


def _preflight(cfg: ModelConfig) -> None:
    """Fail in seconds with a clear message, rather than after a minute of retries."""
    try:
        httpx.get(cfg.base_url.rstrip("/") + "/models", timeout=5.0)
    except httpx.HTTPError as e:
        raise click.ClickException(f"model endpoint {cfg.base_url} is not reachable ({type(e).__name__}); "
                                   "start it, fix models.policy.base_url, or use --scripted") from None


@click.command()
@config_option
@model_options
@click.option("--dataset", type=click.Path(dir_okay=False), default=str(EXAMPLE), show_default=True)
@click.option("--env", "env_name", default="single_tool", show_default=True)
@click.option("-n", "--samples", "n", default=2, show_default=True)
@click.option("--keep", is_flag=True,
              help="Leave the stack, the pools and the model server up after the run (its URLs keep working) "
                   "until Ctrl-C.")
def demo(config_path: str | None, scripted: bool, local_model: bool, dataset: str, env_name: str, n: int,
         keep: bool) -> None:
    """Run a small collection end to end on the embedded defaults, show its best and worst rollout and its
    report, then stop everything (`--keep`: at Ctrl-C)."""
    setup_logging(False)
    settings = settings_or_exit(config_path)
    if not Path(dataset).exists():
        raise click.ClickException(f"dataset {dataset} not found")
    # whatever fails from here on, a model server this command started is stopped
    with policy_model(settings, config_path, "demo", scripted=scripted, local=local_model,
                      local_by_default=True) as policy:
        if policy.source == "config":
            _preflight(policy.settings.models["policy"])
        _run_demo(policy, config_path, dataset, env_name, n, keep)


async def _collect_when_polled(settings: Settings, procs: Sequence[subprocess.Popen], dataset: str, env_name: str,
                               n: int, console: Console) -> Tally:
    console.print("waiting for the worker pools to start polling")
    await wait_for_pools(settings, procs, "policy")
    tally = await collect_dataset(settings, dataset, env=env_name, model="policy", n=n, run_id=f"demo-{env_name}",
                                  console=console)
    await _afterword(settings, f"demo-{env_name}", console)
    return tally


def _abbreviate(text: str, chars: int, lines: int = MESSAGE_LINES) -> str:
    """`text` cut at `chars` characters and `lines` lines, saying how much is left out."""
    text = text.strip()
    kept = text.splitlines()[:lines]
    short = "\n".join(kept)
    if len(short) > chars:
        short = short[:chars].rstrip()
    if len(short) < len(text):
        short += f" [... {len(text) - len(short):,} more characters]"
    return short


def _content(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, list):  # content parts: their text, an image as its type (not its base64)
        return shown_content(content) or ""
    return content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)


def transcript_lines(transcript: Sequence[Any]) -> list[str]:
    """One `role: content` entry per message (tool calls as `-> name(arguments)`), each cut short; continuation
    lines indented under it."""
    out: list[str] = []

    def say(head: str, body: str) -> None:
        first, *rest = body.splitlines() or [""]
        out.append(f"  {head}: {first}".rstrip())
        out.extend(f"      {line}" for line in rest)

    for m in transcript:
        m = m if isinstance(m, dict) else {"role": "?", "content": m}
        role = str(m.get("role") or "?")
        head = f"tool {m['name']}" if role == "tool" and m.get("name") else role
        if m.get("reasoning_content"):
            say(f"{role} (reasoning)", _abbreviate(str(m["reasoning_content"]), SYSTEM_CHARS, 2))
        text = _content(m.get("content"))
        calls = m.get("tool_calls") or ()
        if text or not calls:
            say(head, _abbreviate(text, SYSTEM_CHARS if role == "system" else MESSAGE_CHARS) or "(empty)")
        for call in calls:
            fn = call.get("function") or {}
            args = _abbreviate(str(fn.get("arguments", "")), ARGS_CHARS, 1)
            say(head, f"-> {fn.get('name')}({args})")
    return out


def _print_rollout(console: Console, label: str, r: dict[str, Any]) -> None:
    reward = "-" if r["reward"] is None else f"{float(r['reward']):.4g}"
    console.rule(f"{label} rollout of the run: {r['id']}")
    calls = f"{r['tool_calls']} tool call{'' if r['tool_calls'] == 1 else 's'}"
    console.print(f"{r['status']}, reward {reward}, {r['turns']} turns, {calls}"
                  + (", masked" if r["masked"] else ""), soft_wrap=True, highlight=False, markup=False)
    if r["failure_type"] or r["failure_message"]:
        console.print(f"failure {r['failure_type'] or '-'}: "
                      f"{_abbreviate(r['failure_message'] or '(no message)', MESSAGE_CHARS, 3)}",
                      soft_wrap=True, highlight=False, markup=False)
    for line in transcript_lines(r["transcript"] or []):
        console.print(line, soft_wrap=True, highlight=False, markup=False)


async def _afterword(settings: Settings, run_id: str, console: Console) -> None:
    """The run's best and worst rollout, its report, while the stack is still up to read them from."""
    import sqlalchemy as sa

    from gymflow.kernel.store.reports import rollout_detail
    from gymflow.reports.data import load_run, make_linker, store_session
    from gymflow.reports.text import render_report

    linker = make_linker(settings, None)
    async with store_session(settings, on_wait=console.print) as session:
        ranked = (await session.execute(sa.text(
            "SELECT id FROM rollouts WHERE run_id = :r ORDER BY reward DESC NULLS LAST, id"), {"r": run_id})).scalars()
        ids = list(ranked)
        for label, rid in (("best", ids[0]), ("worst", ids[-1])) if ids else ():
            if (detail := await rollout_detail(session, rid)) is not None:
                _print_rollout(console, label, detail)
            if len(ids) == 1:
                break
        if ids:
            console.print(f"(every message in full: gymflow show {ids[0]})", soft_wrap=True, highlight=False,
                          markup=False)
        if (data := await load_run(session, run_id, per_type=3, examples=3)) is not None:
            console.rule("report")
            render_report(console, [data], linker)


def next_steps(run_id: str, env_name: str, up_flag: str = "", config: str | None = None,
               collect_config: str | None = None, kept: bool = False) -> list[str]:
    """The three commands from the demo on: start the stack with the same model, look at the run, collect your
    own data (with `kept`, the stack is up: looking and collecting first). `config` is the one the demo was
    given; `collect_config` the one naming the model (for a model server: the config `gymflow up FLAG` writes, or
    while `--keep` holds, the demo's own)."""
    with_config = ["--config", config] if config else []
    collect_with = ["--config", collect_config] if collect_config else with_config
    report = shlex.join(["gymflow", "report", run_id, *with_config])
    up = shlex.join(["gymflow", "up", *([up_flag] if up_flag else []), *with_config])
    collect = shlex.join(["gymflow", "collect", "your.jsonl", "--env", env_name, "--model", "policy", *collect_with])
    if kept:
        return ["next, in another shell while this one keeps the stack up:",
                "  # look at the run: scores, pass@k, latency, failures",
                f"  {report}",
                "  # collect your own data (JSONL rows like the example's) with the same model",
                f"  {collect}",
                "  # after Ctrl-C here: the stack, the worker pools and the same model again, until Ctrl-C",
                f"  {up}"]
    return ["next:",
            "  # the stack, the worker pools and the same model again, until Ctrl-C (the run stays stored)",
            f"  {up}",
            "  # in another shell while it runs: look at the run (scores, pass@k, latency, failures)",
            f"  {report}",
            "  # and collect your own data (JSONL rows like the example's) with that model",
            f"  {collect}"]


def _wait_for_ctrl_c(procs: Sequence[subprocess.Popen]) -> None:
    stopping = False

    def _stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    previous = {s: signal.signal(s, _stop) for s in (signal.SIGINT, signal.SIGTERM)}
    warned: set[int] = set()
    try:
        while not stopping:
            time.sleep(0.2)
            for p in procs:
                if p.poll() is not None and p.pid not in warned and not stopping:
                    warned.add(p.pid)
                    click.echo(f"a worker pool exited with {p.returncode}; rollouts wait for one (`gymflow up`)",
                               err=True)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _run_demo(policy: Policy, config_path: str | None, dataset: str, env_name: str, n: int, keep: bool) -> None:
    console = Console()
    run_id = f"demo-{env_name}"
    tables = "tables runs, rollouts, generations; views run_scores, failure_counts, latency_percentiles"
    with embedded_pools(policy.settings, policy.config_path) as (settings, procs, addr):
        console.print(f"Temporal UI: {addr.ui_url}" if addr.ui_url else f"Temporal: {addr.temporal_address}",
                      soft_wrap=True)
        tally = asyncio.run(_collect_when_polled(settings, procs, dataset, env_name, n, console))
        if keep:  # the model named in the demo's own config is up as long as it is
            for line in next_steps(run_id, env_name, policy.flag, config_path, policy.config_path if policy.flag
                                   else None, kept=True):
                click.echo(line)
            model = f", model policy at {policy.base_url}" if policy.flag else ""
            click.echo(f"--keep: all of it stays up until Ctrl-C: Temporal UI {addr.ui_url or addr.temporal_address}, "
                       f"Postgres {addr.database_url} ({tables}), the worker pools{model}")
            sys.stdout.flush()
            _wait_for_ctrl_c(procs)
            click.echo("stopping")
    if keep:
        click.echo("stopped")
    else:
        click.echo(f"results stay in Postgres under {Path(settings.state_dir) / 'postgres'} ({tables}); the stack "
                   "is stopped (`gymflow demo --keep` leaves it up)")
        for line in next_steps(run_id, env_name, policy.flag, config_path,
                               generated_config(settings, "up") if policy.flag else None):
            click.echo(line)
    if tally.failed:
        raise SystemExit(1)
