"""The view's review side: a rollout's labels and the form that adds one, and a run's agreement report
(gymflow/kernel/store/reviews.py does the storing and the counting, as `gymflow review` does).

A form carries the app's token, checked on POST: another site open in the reviewer's browser cannot post labels
to this localhost server on their behalf."""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from gymflow.kernel.store import reviews
from gymflow.kernel.store.repo import driver


async def labels_of(session: AsyncSession, rollout_id: str) -> list[dict[str, Any]]:
    return await reviews.of_rollout(await driver(session), rollout_id)


def label_from_form(rollout_id: str, form: dict[str, str]) -> reviews.Label:
    """The posted form as a Label; ReviewError naming the field for what is not a valid label."""
    raw_reward = (form.get("reward") or "").strip()
    reward: float | None = None
    if raw_reward:
        try:
            reward = float(raw_reward)
        except ValueError:
            raise reviews.ReviewError(f"reward: {raw_reward[:40]!r} is not a number") from None
        if not math.isfinite(reward):
            raise reviews.ReviewError(f"reward: {raw_reward[:40]!r} is not a finite number")
    tags = tuple(t.strip() for t in (form.get("tags") or "").split(",") if t.strip())
    return reviews.Label(rollout_id=rollout_id, reviewer=(form.get("reviewer") or "").strip(),
                         verdict=form.get("verdict") or "", reward=reward, tags=tags,
                         comment=(form.get("comment") or "").strip() or None)


async def add(session: AsyncSession, label: reviews.Label) -> int:
    review_id = await reviews.add_review(await driver(session), label)
    await session.commit()
    return review_id


async def agreement(session: AsyncSession, run_id: str, threshold: float) -> list[dict[str, Any]]:
    return await reviews.agreement(await driver(session), run_id, threshold=threshold)
