"""Tables. Keys are the deterministic rollout id, so every write can be an idempotent upsert."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSONB, list[Any]: JSONB}


class Run(Base):
    __tablename__ = "runs"

    id: Mapped[str] = mapped_column(sa.Text, primary_key=True)
    env: Mapped[str | None] = mapped_column(sa.Text)
    model: Mapped[str | None] = mapped_column(sa.Text)
    dataset: Mapped[str | None] = mapped_column(sa.Text)
    samples_per_task: Mapped[int | None]
    config: Mapped[dict[str, Any]] = mapped_column(server_default=sa.text("'{}'::jsonb"))
    dataset_errors: Mapped[list[Any]] = mapped_column(server_default=sa.text("'[]'::jsonb"))
    created_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), server_default=sa.func.now())


class Rollout(Base):
    """The view `rollouts` (migration 0008): the row of `rollout_rows` with its transcript read from the accepted
    chain. Read it here; the store writes `rollout_rows` (kernel/store/repo.py)."""

    __tablename__ = "rollouts"

    id: Mapped[str] = mapped_column(sa.Text, primary_key=True, comment="<run>/<task>/<sample>")
    run_id: Mapped[str] = mapped_column(sa.Text, index=True)
    task_id: Mapped[str] = mapped_column(sa.Text)
    sample_index: Mapped[int]
    env: Mapped[str] = mapped_column(sa.Text)
    model: Mapped[str] = mapped_column(sa.Text)
    status: Mapped[str] = mapped_column(sa.Text, index=True)
    reward: Mapped[float | None]
    masked: Mapped[bool] = mapped_column(server_default=sa.false())
    failure_type: Mapped[str | None] = mapped_column(sa.Text)
    failure_message: Mapped[str | None] = mapped_column(sa.Text)
    turns: Mapped[int] = mapped_column(server_default="0")
    tool_calls: Mapped[int] = mapped_column(server_default="0")
    prompt_tokens: Mapped[int] = mapped_column(server_default="0")
    completion_tokens: Mapped[int] = mapped_column(server_default="0")
    attempts: Mapped[int] = mapped_column(server_default="0", comment="generation attempts, retries included")
    latency_s: Mapped[float | None]
    transcript: Mapped[list[Any]] = mapped_column(deferred=True)  # derived: megabytes for a long episode
    score_details: Mapped[dict[str, Any]] = mapped_column(server_default=sa.text("'{}'::jsonb"))
    started_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), server_default=sa.func.now())
    finished_at: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))
    # The fence (gymflow/kernel/store/fence.py): the workflow execution whose writes the row holds, when it started
    # (Temporal's clock), and the executions it took the row from, which may never write it again.
    execution_id: Mapped[str | None] = mapped_column(sa.Text)
    execution_started_at: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))
    superseded_executions: Mapped[list[str]] = mapped_column(ARRAY(sa.Text), server_default="{}")
    head_id: Mapped[int | None] = mapped_column(sa.BigInteger, comment="last message of the accepted chain")


class Generation(Base):
    """The view `generations` (migration 0008): one model call of one turn of the accepted chain, read from its
    assistant message. Token ids and logprobs live in the chain, never in workflow history."""

    __tablename__ = "generations"

    rollout_id: Mapped[str] = mapped_column(sa.Text, primary_key=True)
    turn: Mapped[int] = mapped_column(primary_key=True)
    attempt: Mapped[int]
    model: Mapped[str] = mapped_column(sa.Text)
    finish_reason: Mapped[str | None] = mapped_column(sa.Text)
    prompt_tokens: Mapped[int] = mapped_column(server_default="0")
    completion_tokens: Mapped[int] = mapped_column(server_default="0")
    latency_s: Mapped[float | None]
    message: Mapped[dict[str, Any]] = mapped_column(server_default=sa.text("'{}'::jsonb"))
    prompt_token_ids: Mapped[list[Any] | None] = mapped_column(JSONB)
    generation_token_ids: Mapped[list[Any] | None] = mapped_column(JSONB)
    generation_log_probs: Mapped[list[Any] | None] = mapped_column(JSONB)
    policy_version: Mapped[str | None] = mapped_column(sa.Text, comment="policy that generated the turn (0005)")
    created_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), server_default=sa.func.now())


class PolicyVersion(Base):
    """The policy a trainer declared current for a model; the highest ordinal is current (migration 0006)."""

    __tablename__ = "policy_versions"

    model: Mapped[str] = mapped_column(sa.Text, primary_key=True)
    ordinal: Mapped[int] = mapped_column(primary_key=True, comment="1, 2, ... per model, in the order set")
    version: Mapped[str] = mapped_column(sa.Text)
    set_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), server_default=sa.func.now())


class TaskRow(Base):
    """A dataset row, stored once per run: workflows carry (run, task id), never the task (migration 0003)."""

    __tablename__ = "tasks"

    run_id: Mapped[str] = mapped_column(sa.Text, primary_key=True)
    task_id: Mapped[str] = mapped_column(sa.Text, primary_key=True)
    env: Mapped[str] = mapped_column(sa.Text)
    body: Mapped[dict[str, Any]] = mapped_column(JSONB)
    tools: Mapped[list[Any] | None] = mapped_column(JSONB, comment="tool schemas the environment offers (0004)")
    created_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), server_default=sa.func.now())


class MessageRow(Base):
    """One message of an episode, pointing at its parent: a head id names the whole prefix (migration 0003).

    Append-only. `producer` is the writing activity (`<workflow run id>/<activity id>`), so a retried or zombie
    attempt finds the batch already written instead of adding a second one."""

    __tablename__ = "messages"
    __table_args__ = (sa.UniqueConstraint("rollout_id", "producer", "producer_index", name="messages_producer_key"),)

    id: Mapped[int] = mapped_column(sa.BigInteger, sa.Identity(), primary_key=True)
    rollout_id: Mapped[str] = mapped_column(sa.Text)
    parent_id: Mapped[int | None] = mapped_column(sa.BigInteger, sa.ForeignKey("messages.id"), index=True)
    position: Mapped[int]
    producer: Mapped[str] = mapped_column(sa.Text)
    producer_index: Mapped[int]
    role: Mapped[str] = mapped_column(sa.Text)
    body: Mapped[dict[str, Any]] = mapped_column(JSONB)
    state: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    tokens: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    created_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), server_default=sa.func.now())
