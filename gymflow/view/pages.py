"""Each page's data, read from the store and rendered: the runs, one run, one rollout (and the rollout's JSON
endpoints). A loader returns None for an id the store does not hold; the app answers that with a 404 page."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from gymflow.kernel.store.reports import recent_runs, similar_rollout_ids, top_failures
from gymflow.reports.data import Linker
from gymflow.reports.health import Check, known_run
from gymflow.reports.profile import load_profile
from gymflow.view import conversation, filters, fragments, queries
from gymflow.view import review as review_side
from gymflow.view.render import page

PROFILE_TASKS = 100  # tasks listed on the run page; `gymflow profile RUN` lists every one
TEXT_FIELDS = ("content", "reasoning_content", "tool_calls")


async def runs_page(session: AsyncSession) -> str:
    return page("runs.html", runs=await queries.runs(session))


async def run_exists(session: AsyncSession, run_id: str) -> bool:
    return await known_run(session, run_id)


async def not_found_page(session: AsyncSession, kind: str, ident: str) -> str:
    """A 404 that names the id, and what does exist nearby."""
    if kind == "run":
        near = await recent_runs(session)
    else:
        near = await similar_rollout_ids(session, ident)
    return page("not_found.html", kind=kind, ident=ident, near=near)


async def run_page(session: AsyncSession, run_id: str, query: Mapping[str, str], cache: fragments.Cache
                   ) -> str | None:
    # The summary and failure types scan the whole run: kept per run state (one cheaper scan) for the next page.
    summary, failure_types = await fragments.summary_of(cache, session, run_id)
    if summary is None:
        return None
    q = filters.parse(query)
    # Unfiltered, the count is the run's own: one scan fewer.
    rows, total = await queries.table_page(session, run_id, q, total=None if q.filters else int(summary["rollouts"]))
    return page("run.html", run=summary, q=q, rows=rows, total=total, pages=max(1, -(-total // q.size)),
                failure_types=failure_types, statuses=filters.STATUSES,
                plots=fragments.PLOTS)


async def details_fragment(session: AsyncSession, run_id: str) -> str:
    """The run page's per-task profile, latency percentiles and most frequent failure messages (each reads every
    rollout of the run, so they come after the page, cached by `fragments`)."""
    profile = await load_profile(session, run_id)
    return page("details.html", q=filters.TableQuery(), profile=profile,
                profile_tasks=profile.tasks[:PROFILE_TASKS] if profile else [],
                failures=await top_failures(session, run_id, per_type=3, examples=3),
                latency=await queries.latency(session, run_id))


def health_fragment(checks: list[Check]) -> str:
    return page("health.html", checks=checks)


async def _chain_ids(session: AsyncSession, row: queries.Row) -> list[queries.Row] | None:
    """The chain's (id, role, generated) rows, or None for a rollout stored whole before migration 0008."""
    head = await queries.head_of(session, row)
    if head is not None:
        return await queries.chain(session, head)
    return None if row["stored_before_0008"] else []


async def rollout_page(session: AsyncSession, rollout_id: str, page_no: int, linker: Linker, *,
                       form_token: str = "", review_problem: str | None = None, form: dict[str, str] | None = None
                       ) -> str | None:
    row = await queries.rollout(session, rollout_id)
    if row is None:
        return None
    chain = await _chain_ids(session, row)
    if chain is None:  # stored whole (before 0008): page the stored transcript
        transcript = await queries.old_transcript(session, rollout_id)
        turns = _old_turn_numbers(transcript, len(await queries.old_turns(session, rollout_id)))
        first, end, pages = conversation.page_bounds(len(transcript), page_no)
        shown = conversation.from_transcript(transcript[first:end], first, turns)
        total = len(transcript)
    else:
        turns = conversation.turn_numbers([bool(c["generated"]) for c in chain])
        first, end, pages = conversation.page_bounds(len(chain), page_no)
        rows = await queries.messages(session, [c["id"] for c in chain[first:end]])
        shown = conversation.from_rows(rows, first, turns)
        total = len(chain)
    return page("rollout.html", r=row, messages=shown, total=total, first=first, end=end, pages=pages,
                page_no=min(max(page_no, 1), pages), turns=len(turns), ui_url=linker(rollout_id),
                live=row["status"] == "running", cut=queries.CUT, form_token=form_token,
                labels=await review_side.labels_of(session, rollout_id), review_problem=review_problem,
                form=form or {})


def _old_turn_numbers(transcript: list[Any], generations: int) -> dict[int, int]:
    # The generated turns are the last `generations` assistant messages (the prompt's own come first).
    assistants = [i for i, m in enumerate(transcript) if isinstance(m, dict) and m.get("role") == "assistant"]
    picked = assistants[len(assistants) - generations:] if generations else []
    return {i: n for n, i in enumerate(picked)}


async def _message_id(session: AsyncSession, row: queries.Row, index: int) -> int | None:
    chain = await _chain_ids(session, row)
    if chain is None or not 0 <= index < len(chain):
        return None
    return int(chain[index]["id"])


async def message_text(session: AsyncSession, rollout_id: str, index: int, field: str) -> str | None:
    """One message field in full (the page shows the first `queries.CUT` characters)."""
    row = await queries.rollout(session, rollout_id)
    if row is None or field not in TEXT_FIELDS:
        return None
    mid = await _message_id(session, row, index)
    if mid is not None:
        return await queries.message_field(session, rollout_id, mid, field)
    if row["stored_before_0008"]:
        transcript = await queries.old_transcript(session, rollout_id)
        if 0 <= index < len(transcript) and isinstance(transcript[index], dict):
            value = transcript[index].get(field)
            return value if isinstance(value, str) or value is None else conversation.as_text(value)
    return None


_TOKEN_KEYS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")


async def turn_tokens(session: AsyncSession, rollout_id: str, turn: int) -> dict[str, Any] | None:
    """Turn `turn`'s token ids and logprobs (the lists a page never loads by itself) and its metadata."""
    row = await queries.rollout(session, rollout_id)
    if row is None:
        return None
    chain = await _chain_ids(session, row)
    if chain is None:
        old = await queries.old_tokens(session, rollout_id, turn)
        return None if old is None else {"turn": turn, **old}
    generated = [c for c in chain if c["generated"]]
    if not 0 <= turn < len(generated):
        return None
    tokens = await queries.message_tokens(session, rollout_id, int(generated[turn]["id"])) or {}
    lists = {k: tokens.get(k) if isinstance(tokens.get(k), list) else None for k in _TOKEN_KEYS}
    meta = {k: v for k, v in tokens.items() if k not in _TOKEN_KEYS}
    return {"turn": turn, **lists, "meta": meta}


async def live_state(session: AsyncSession, rollout_id: str) -> dict[str, Any] | None:
    """What the running page polls: its status and how many messages its chain has."""
    row = await queries.rollout(session, rollout_id)
    if row is None:
        return None
    chain = await _chain_ids(session, row)
    return {"status": row["status"], "messages": len(chain or []), "reward": row["reward"]}
