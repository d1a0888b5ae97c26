"""Groups: the `n` samples of one task, judged as a whole once the last member has ended.

A trainer computing group-relative advantages must never take a partial group for a whole one, so every group
carries an explicit verdict:

- `complete`: every member completed with a reward (not masked).
- `partial`: some members failed or were masked; they are listed in `failed` and the trainer decides.
- `dropped`: incomplete and the policy said drop (or retries did not mend it); not for training.
- `stale`: its oldest turn is more versions behind the current policy than allowed; not for training.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from gymflow.kernel.wire import RolloutSummary, Task

if TYPE_CHECKING:
    from gymflow.client import GymflowClient
    from gymflow.training.records import TrainingRecord

Verdict = Literal["complete", "partial", "dropped", "stale"]
Incomplete = Literal["wait", "drop", "partial"]
INCOMPLETE_POLICIES: tuple[Incomplete, ...] = ("wait", "drop", "partial")
TRAINABLE: frozenset[Verdict] = frozenset({"complete", "partial"})


def usable(member: RolloutSummary) -> bool:
    """A member a trainer can use: completed, scored, not masked."""
    return member.status == "completed" and not member.masked and member.reward is not None


def group_id(run_id: str, task_id: str, epoch: int) -> str:
    """`RUN/TASK/eEPOCH`: one task's samples in one epoch, the unit GRPO normalises over. The iterator hands groups
    over under this id and `gymflow export` writes it, so a trainer can join the two."""
    return f"{run_id}/{task_id}/e{epoch}"


def epoch_of(sample_index: int, samples_per_task: int | None) -> int:
    """Epoch `e`, sample `i` of a task is sample index `e * n + i` (iterator.py); a run whose `n` was not recorded
    (collected once through the Python client) is one epoch."""
    return sample_index // samples_per_task if samples_per_task else 0


@dataclass(frozen=True)
class Group:
    run_id: str
    task: Task
    epoch: int
    index: int  # position of the task in its epoch's (shuffled) order
    members: tuple[RolloutSummary, ...]  # by sample index
    verdict: Verdict
    failed: tuple[int, ...] = ()  # sample indices of the members that are not usable
    staleness: int | None = None  # current ordinal - the oldest turn's ordinal; None when not measured
    restarts: int = 0  # stale members started again (stale="cancel_and_restart")
    retries: int = 0  # rounds of re-running failed members (incomplete="wait")
    reason: str | None = None  # why dropped or stale, in words

    @property
    def group_id(self) -> str:
        return group_id(self.run_id, self.task.id, self.epoch)

    @property
    def trainable(self) -> bool:
        return self.verdict in TRAINABLE

    @property
    def rewards(self) -> list[float | None]:
        """Per member; None where the member is not usable (failed or masked)."""
        return [m.reward if usable(m) else None for m in self.members]

    async def records(self, client: GymflowClient) -> list[TrainingRecord]:
        """A token-exact training record per usable member (records.py); for many groups at once, in one
        query, use `group_records(client, groups)`."""
        from gymflow.training.records import group_records

        return (await group_records(client, [self]))[0]


def failed_members(members: tuple[RolloutSummary, ...]) -> tuple[int, ...]:
    return tuple(m.sample_index for m in members if not usable(m))


def incomplete_verdict(members: tuple[RolloutSummary, ...], incomplete: Incomplete) -> tuple[Verdict, str | None]:
    """The verdict of a finished group before staleness: complete, else what `incomplete` says. `wait` reaches
    here only after its retries, so what is still missing then is dropped."""
    failed = failed_members(members)
    if not failed:
        return "complete", None
    if incomplete == "partial":
        return "partial", None
    why = ", ".join(sorted({(m.failure_type or ("masked" if m.masked else m.status)) for m in members
                            if not usable(m)}))
    after = " after retries" if incomplete == "wait" else ""
    return "dropped", f"{len(failed)} of {len(members)} members not usable{after} ({why})"
