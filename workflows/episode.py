"""EpisodeWorkflow: one episode = begin, (generate, run_tools)* until no tool calls, max turns or a tool call
that ends the episode (environments/base.py), finish.

The by-reference shape of docs/design-episode-data.md: the workflow keeps the head message id and counters;
activities read the episode from Postgres and append what they produce. Every payload in its history is ids,
counters and short strings, whatever the number of turns, the task's size or the tools' output.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutError

with workflow.unsafe.imports_passed_through():
    from gymflow.workflows.options import activity_options, failure_of, local_activity_options, should_continue_as_new

    from gymflow.kernel import names
    from gymflow.kernel.episode_wire import (
        BeginRequest,
        EpisodeInput,
        EpisodeRef,
        Finished,
        FinishPlan,
        FinishRequest,
        Generated,
        ToolsRan,
        Turned,
        TurnRequest,
        advanced,
        episode_summary,
        with_tools,
    )
    from gymflow.kernel.wire import ActivityLimits, RolloutSummary

R = TypeVar("R")


async def _local_activity(name: str, arg: Any, result_type: type[R], limits: ActivityLimits) -> R:
    """A local activity, its failure raised as ActivityError like a queued activity's: the SDK raises a local
    activity's own failure (ApplicationError, TimeoutError) unwrapped, and every step's failure must reach the
    same handling (recorded with its transcript, typed), wherever the step ran."""
    try:
        return await workflow.execute_local_activity(name, arg, result_type=result_type,
                                                     **local_activity_options(limits))
    except (ApplicationError, TimeoutError) as err:
        raise ActivityError(err.message, scheduled_event_id=0, started_event_id=0, identity="", activity_type=name,
                            activity_id="", retry_state=None) from err


@workflow.defn(name=names.EPISODE_WORKFLOW)
class EpisodeWorkflow:
    def __init__(self) -> None:
        self._stage = "starting"
        self._episode: EpisodeRef | None = None  # the last accepted head, kept for failure records
        self._finished: Finished | None = None  # set when the last turn's activity verified and persisted

    @workflow.query
    def stage(self) -> str:
        turn = self._episode.turn if self._episode else 0
        return f"{self._stage} (turn {turn})"

    def _enter(self, stage: str) -> None:
        self._stage = stage
        workflow.set_current_details(f"{stage}, turn {self._episode.turn if self._episode else 0}")

    @workflow.run
    async def run(self, inp: EpisodeInput) -> RolloutSummary:
        started = inp.episode.started_at if inp.episode else workflow.now()
        self._episode = inp.episode
        failure: tuple[str, str] | None = None
        # Every step local: begin and finish fold into the turns, so a single-turn episode is one local activity
        # instead of three. Needs at least one turn left to fold them into.
        folded = (inp.placement == "local" and inp.generate_placement == "local"
                  and (self._episode.turn if self._episode else 0) < inp.max_turns)
        try:
            if self._episode is None and not folded:
                self._episode = await self._begin(inp, started)
            await (self._folded_turns(inp, started) if folded else self._turns(inp))
        except ActivityError as err:
            failure = failure_of(err)
        if self._finished is not None:
            return self._completed(self._summary(inp, started, None), self._finished, None)
        return await self._finish(inp, started, failure)

    async def _on_env(self, inp: EpisodeInput, name: str, arg: Any, result_type: type[R],
                      limits: ActivityLimits | None = None) -> R:
        """An environment-side step: a local activity in this pool for environments placed "local" (no task
        queue round trip: fewer transitions), else an activity on the env pool. Same timeouts and retries."""
        limits = limits or inp.limits.env
        if inp.placement == "local":
            return await _local_activity(name, arg, result_type, limits)
        return await workflow.execute_activity(name, arg, result_type=result_type,
                                               **activity_options(limits, names.ENV_QUEUE))

    async def _begin(self, inp: EpisodeInput, started: datetime) -> EpisodeRef:
        self._enter("setup")
        head = await self._on_env(inp, names.EPISODE_BEGIN, self._begin_request(inp), int)
        return EpisodeRef(head_id=head, started_at=started)

    @staticmethod
    def _begin_request(inp: EpisodeInput) -> BeginRequest:
        return BeginRequest(rollout_id=inp.rollout_id, run_id=inp.run_id, task_id=inp.task_id,
                            sample_index=inp.sample_index, model=inp.model,
                            execution_started_at=workflow.info().workflow_start_time)

    async def _turns(self, inp: EpisodeInput) -> None:
        gen_opts = activity_options(inp.limits.generate, names.generate_queue(inp.model))
        turns_here = 0
        while (ep := self._episode) is not None and ep.turn < inp.max_turns:
            if turns_here and should_continue_as_new(inp.turns_per_run, turns_here):
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(inp.model_copy(update={"episode": ep}))
            self._enter("generate")
            turn = self._turn_request(inp, ep)
            if inp.generate_placement == "local":  # this pool calls the model (models.<name>.placement)
                gen = await _local_activity(names.EPISODE_GENERATE, turn, Generated, inp.limits.generate)
            else:
                gen = await workflow.execute_activity(names.EPISODE_GENERATE, turn, result_type=Generated,
                                                      **gen_opts)
            ep = self._generated(ep, gen)
            turns_here += 1
            if not gen.tool_calls and not gen.responds:
                return
            self._enter("tools")
            ran = await self._on_env(inp, names.EPISODE_RUN_TOOLS,
                                     turn.model_copy(update={"head_id": ep.head_id}), ToolsRan)
            self._episode = with_tools(ep, ran)
            if ran.done:  # the environment ended the episode
                return

    async def _folded_turns(self, inp: EpisodeInput, started: datetime) -> None:
        """Every step local: each turn is one local activity, the first one begins the
        episode, and the one after which it ends verifies and persists it (then `_finished` is set)."""
        turns_here = 0
        while self._finished is None:  # bounded: every turn advances ep.turn, and max_turns ends the episode
            ep = self._episode
            if ep is not None and turns_here and should_continue_as_new(inp.turns_per_run, turns_here):
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(inp.model_copy(update={"episode": ep}))
            self._enter("generate" if ep is not None else "setup")
            before = ep or EpisodeRef(head_id=0, started_at=started)
            turn = self._turn_request(inp, before).model_copy(update={
                "begin": None if ep is not None else self._begin_request(inp),
                "finish": FinishPlan(episode=before, env=inp.env, sample_index=inp.sample_index,
                                     max_turns=inp.max_turns,
                                     execution_started_at=workflow.info().workflow_start_time)})
            turned = await self._turn_here(inp, turn, started)
            self._episode = advanced(before, turned.generated, turned.ran)
            self._finished = turned.finished
            turns_here += 1

    @staticmethod
    def _turn_request(inp: EpisodeInput, ep: EpisodeRef) -> TurnRequest:
        return TurnRequest(rollout_id=inp.rollout_id, run_id=inp.run_id, task_id=inp.task_id, model=inp.model,
                           turn=ep.turn, head_id=ep.head_id, sampling=inp.sampling,
                           max_episode_bytes=inp.limits.max_episode_bytes,
                           max_reply_chars=inp.limits.max_reply_chars,
                           max_tool_calls_per_turn=inp.limits.max_tool_calls_per_turn)

    def _generated(self, ep: EpisodeRef, gen: Generated) -> EpisodeRef:
        self._episode = advanced(ep, gen, None)
        return self._episode

    async def _turn_here(self, inp: EpisodeInput, turn: TurnRequest, started: datetime) -> Turned:
        """The turn as one local activity (generate and run_tools; the first turn also begins the episode, the last
        finishes it). When it failed after storing part of the turn, the failure's details say what (the begun
        head, the reply, the tool messages): the episode keeps them, so the recorded transcript ends where the
        episode did."""
        try:
            return await _local_activity(names.EPISODE_TURN, turn, Turned, inp.limits.generate)
        except ActivityError as err:
            cause = err.cause
            stored = cause.details[0] if isinstance(cause, ApplicationError) and cause.details else None
            if isinstance(stored, dict):
                self._keep_stored(stored, started)
            raise

    def _keep_stored(self, stored: dict[str, Any], started: datetime) -> None:
        if "begun" in stored and self._episode is None:
            self._episode = EpisodeRef(head_id=stored["begun"], started_at=started)
        if "generated" in stored and self._episode is not None:
            ran = ToolsRan.model_validate(stored["ran"]) if "ran" in stored else None
            self._episode = advanced(self._episode, Generated.model_validate(stored["generated"]), ran)

    def _summary(self, inp: EpisodeInput, started: datetime, failure: tuple[str, str] | None) -> RolloutSummary:
        return episode_summary(rollout_id=inp.rollout_id, run_id=inp.run_id, task_id=inp.task_id,
                               sample_index=inp.sample_index, ep=self._episode, failure=failure,
                               latency_s=(workflow.now() - started).total_seconds())

    async def _finish(self, inp: EpisodeInput, started: datetime, failure: tuple[str, str] | None) -> RolloutSummary:
        ep = self._episode
        summary = self._summary(inp, started, failure)
        self._enter("verify" if failure is None else "persist")
        request = FinishRequest(summary=summary, env=inp.env, model=inp.model, head_id=ep.head_id if ep else None,
                                verify=failure is None, started_at=started,
                                execution_started_at=workflow.info().workflow_start_time)
        try:
            try:
                done = await self._on_env(inp, names.EPISODE_FINISH, request, Finished)
            except ActivityError as err:
                if failure is not None:
                    raise
                # Verification failed for good: record the rollout as failed with that type, unverified.
                failure = failure_of(err)
                summary = summary.model_copy(update={"status": "failed", "failure_type": failure[0],
                                                     "failure_message": failure[1]})
                done = await self._on_env(
                    inp, names.EPISODE_FINISH, request.model_copy(update={"summary": summary, "verify": False}),
                    Finished, inp.limits.persist)
        except ActivityError as err:
            # Not recorded: fail typed and short, with no summary in the details (which would tell the client
            # it had been recorded), so the client records it once the store is back.
            kind, message = failure_of(err)
            raise ApplicationError(message, type=kind, non_retryable=True) from None
        return self._completed(summary, done, failure)

    def _completed(self, summary: RolloutSummary, done: Finished, failure: tuple[str, str] | None) -> RolloutSummary:
        """The workflow's result once the rollout is persisted (a failure raises, carrying the summary)."""
        summary = summary.model_copy(update={"reward": done.reward, "masked": done.masked,
                                             "failure_type": done.failure_type,
                                             "latency_s": summary.latency_s if done.latency_s is None
                                             else done.latency_s})
        updates = [names.SA_STATUS.value_set("masked" if summary.masked else summary.status)]
        if summary.reward is not None:
            updates.append(names.SA_REWARD.value_set(summary.reward))
        workflow.upsert_search_attributes(updates)
        self._enter(summary.status)
        if failure:
            # Details: the recorded summary (the client's), and where the episode stood (`gymflow resume` starts
            # a new run there).
            where = self._episode.model_dump(mode="json") if self._episode else None
            raise ApplicationError(failure[1], summary.model_dump(mode="json"), where, type=failure[0],
                                   non_retryable=True)
        return summary
