"""Live progress (done, failed, masked, rate, mean reward) and the end-of-run summary table."""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass, field

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gymflow.client import CollectResult


@dataclass
class Tally:
    total: int
    started_at: float = field(default_factory=time.monotonic)
    skipped: int = 0  # dataset rows that did not load (reported by line before the run)
    done: int = 0
    failed: int = 0
    masked: int = 0
    rewards: list[float] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)

    def add(self, r: CollectResult) -> None:
        s = r.summary
        self.done += 1
        self.outcomes[r.outcome] += 1
        if s.status == "failed":
            self.failed += 1
            self.failures[s.failure_type or "unknown"] += 1
        elif s.masked:
            self.masked += 1
            self.failures[f"masked:{s.failure_type or 'unknown'}"] += 1
        elif s.reward is not None:
            self.rewards.append(s.reward)

    @property
    def mean_reward(self) -> float | None:
        return sum(self.rewards) / len(self.rewards) if self.rewards else None

    @property
    def ran_now(self) -> int:
        """Rollouts that ran during this invocation; `finished` ones were done before it started."""
        return self.outcomes["started"] + self.outcomes["attached"]

    @property
    def rate(self) -> float:
        return self.ran_now / max(time.monotonic() - self.started_at, 1e-9)

    def line(self) -> str:
        mean = f"{self.mean_reward:.3f}" if self.mean_reward is not None else "-"
        return (f"failed {self.failed}  masked {self.masked}  {self.rate:.1f}/s  mean reward {mean}")


LOG_WIDTH = 1000  # off a terminal (a log file, a pipe): wide enough that no progress or summary line is cut


def log_console(console: Console | None = None) -> Console:
    """`console` (or a new one) at a terminal or where $COLUMNS asks for a width; off a terminal, one that cuts no
    line (rich would wrap at 80 columns)."""
    console = console or Console()
    if console.is_terminal or os.environ.get("COLUMNS"):
        return console
    return Console(file=console.file, width=max(console.width, LOG_WIDTH), highlight=False)


def progress_bar(console: Console) -> Progress:
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[stats]}"), TimeElapsedColumn(), console=console)


def summary_table(run_id: str, t: Tally) -> Table:
    table = Table(title=f"run {run_id}", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("rollouts", str(t.total))
    table.add_row("skipped rows", str(t.skipped))
    table.add_row("completed (scored)", str(len(t.rewards)))
    table.add_row("failed", str(t.failed))
    table.add_row("masked", str(t.masked))
    table.add_row("mean reward", f"{t.mean_reward:.4f}" if t.mean_reward is not None else "-")
    table.add_row("started now / attached / already finished",
                  f"{t.outcomes['started']} / {t.outcomes['attached']} / {t.outcomes['finished']}")
    if t.outcomes["rejected"]:
        table.add_row("refused by Temporal (start_rejected)", str(t.outcomes["rejected"]))
    table.add_row("rate", f"{t.rate:.2f} rollouts/s")
    for kind, n in t.failures.most_common():
        table.add_row(f"  failure {kind}", str(n))
    return table
