"""`gymflow view` shows a message of content parts (an image prompt) as its text with each image as a one-line
placeholder, not as the parts' JSON with kilobytes of base64: from the episode's messages (SQL) and from a
transcript stored whole (Python), alike."""

from __future__ import annotations

import base64
import json
from urllib.parse import quote

import httpx
import psycopg

from gymflow.view.conversation import as_text
from tests.test_view import _serve

PNG = "data:image/png;base64," + base64.b64encode(b"\x89PNG" + b"\0" * 6000).decode()
PARTS = [{"type": "image_url", "image_url": {"url": PNG, "detail": "low"}}, {"type": "text", "text": "How many?"},
         {"type": "image_url", "image_url": {"url": "https://example.com/x.png"}}, 7]
SHOWN = (f"[image: image/png, {len(PNG)} characters]\nHow many?\n[image: not a data URL, 25 characters]\n7")


def test_a_transcript_stored_whole_shows_parts_as_text() -> None:
    assert as_text(PARTS) == SHOWN
    assert as_text("plain") == "plain" and as_text({"a": 1}) == '{"a": 1}'


async def test_the_rollout_page_shows_an_image_prompt_as_text_and_placeholders(stack, run_id) -> None:
    rollout_id = f"{run_id}/img/0"
    with psycopg.connect(stack.database_url, autocommit=True) as conn:
        head = conn.execute(
            "INSERT INTO messages (rollout_id, parent_id, position, producer, producer_index, role, body) "
            "VALUES (%s, NULL, 0, 'test', 0, 'user', %s) RETURNING id",
            (rollout_id, json.dumps({"role": "user", "content": PARTS}))).fetchone()[0]
        conn.execute("INSERT INTO rollout_rows (id, run_id, task_id, sample_index, env, model, status, reward, "
                     "turns, head_id, finished_at) VALUES (%s, %s, 'img', 0, 'single_tool', 'policy', 'completed', "
                     "1.0, 0, %s, now())", (rollout_id, run_id, head))
    runner, base = await _serve(stack.database_url)
    try:
        async with httpx.AsyncClient(timeout=30, trust_env=False) as client:
            page = await client.get(f"{base}/rollouts/{quote(rollout_id, safe='')}")
        assert page.status_code == 200
        assert f"[image: image/png, {len(PNG)} characters]" in page.text and "How many?" in page.text
        assert PNG[30:80] not in page.text  # no base64 on the page
    finally:
        await runner.cleanup()
