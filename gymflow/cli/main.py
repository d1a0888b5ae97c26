"""`gymflow`: the command group. Each subcommand lives in its own module."""

from __future__ import annotations

import logging
import os
import sys
import traceback

import click

from gymflow.cli.codec_cmd import codec
from gymflow.cli.collect_cmd import collect
from gymflow.cli.data_cmd import data
from gymflow.cli.demo_cmd import demo
from gymflow.cli.env_cmd import env
from gymflow.cli.export_cmd import export
from gymflow.cli.profile_cmd import check, profile
from gymflow.cli.report_cmd import report
from gymflow.cli.rescore_cmd import rescore
from gymflow.cli.resume_cmd import resume
from gymflow.cli.review_cmd import review
from gymflow.cli.show_cmd import show
from gymflow.cli.stack_cmd import up, worker
from gymflow.cli.view_cmd import view

TRACEBACK_ENV = "GYMFLOW_TRACEBACK"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Durable LLM RL rollout collection on Temporal and Postgres."""


cli.add_command(up)
cli.add_command(worker)
cli.add_command(codec)
cli.add_command(collect)
cli.add_command(demo)
cli.add_command(env)
cli.add_command(data)
cli.add_command(report)
cli.add_command(profile)
cli.add_command(check)
cli.add_command(show)
cli.add_command(resume)
cli.add_command(rescore)
cli.add_command(review)
cli.add_command(export)
cli.add_command(view)


def main() -> None:
    """The `gymflow` entry point. It leaves through `os._exit` once output is flushed: the Temporal SDK's
    Rust threads can abort CPython's finalisation (temporalio/sdk-python#300), turning a clean exit into
    SIGABRT; by then every worker has shut down gracefully and every connection is closed. An unexpected
    exception is reported in one line and exits 1 the same way, so no command can hang on exit."""
    code = 0
    try:
        cli()
    except SystemExit as e:
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException as e:  # noqa: BLE001 - an unexpected error still ends the process, in one line
        if os.environ.get(TRACEBACK_ENV):
            traceback.print_exc()
        first = (str(e).strip().splitlines() or [""])[0][:500]
        print(f"Error: unexpected {type(e).__name__}: {first} (set {TRACEBACK_ENV}=1 for the traceback)",
              file=sys.stderr)
        code = 1
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
