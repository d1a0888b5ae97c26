"""`gymflow view` in a real browser (Debian's Chromium driven by Playwright): runs -> run -> rollout on a run
collected through the stack, a filter, a sort, paging, tokens on demand, model output that tries to run a script,
a long episode of large messages stored by SQL, a running episode's live reload, and 404s that name the id.
Screenshots of each page land in the test's tmp folder."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest
from aiohttp import web
from gymflow.workers.local_stack import free_port

from gymflow.reports.data import workflow_url
from gymflow.testing.scripted_openai import context_length_error, text, tool_call
from gymflow.view.app import make_app
from tests.helpers import weather_task

CHROMIUM = "/usr/bin/chromium"
UI = "http://ui.test:8233"
HOSTILE = "<script>window.pwned=1</script>\x00after the nul <img src=x onerror=window.pwned=2>"
BIG = 10 * 2**20  # characters in one message of the long episode

pytestmark = pytest.mark.skipif(shutil.which(CHROMIUM) is None,
                                reason="chromium is not installed (apt-get install chromium)")


async def _seed(gf, scripted, run_id: str) -> None:
    plan = [("a", 0, [tool_call("get_weather", {"city": "SF"}, logprobs=True),
                      text("It is cold in SF.", logprobs=True)]),
            ("a", 1, [text("no idea", logprobs=True)]),
            ("b", 0, [text(HOSTILE, logprobs=True)]),
            ("c", 0, [context_length_error()])]
    for task_id, sample, replies in plan:
        scripted.script(*replies)
        await gf.run_rollout(gf.make_input(run_id, weather_task(task_id), sample, "vllm"))


def _store_episode(url: str, run_id: str, rollout_id: str, messages: int, *, status: str, big: bool) -> int:
    """A rollout stored as the episode stores it: a chain of `messages`, its head on the row (none while running)."""
    with psycopg.connect(url, autocommit=True) as conn:
        parent = None
        for i in range(messages):
            role = "user" if i == 0 else "assistant" if i % 2 else "tool"
            content = ("x" * BIG if big and i == 3 else f"message number {i}")
            tokens = json.dumps({"finish_reason": "stop", "usage": {"prompt_tokens": i, "completion_tokens": 1},
                                 "generation_token_ids": [i], "generation_log_probs": [-0.5]}) if role == "assistant" \
                else None
            parent = conn.execute(
                "INSERT INTO messages (rollout_id, parent_id, position, producer, producer_index, role, body, tokens) "
                "VALUES (%s, %s, %s, 'test', %s, %s, %s, %s) RETURNING id",
                (rollout_id, parent, i, i, role, json.dumps({"role": role, "content": content}), tokens)).fetchone()[0]
        conn.execute("INSERT INTO rollout_rows (id, run_id, task_id, sample_index, env, model, status, reward, turns, "
                     "head_id, finished_at) VALUES (%s, %s, %s, 0, 'single_tool', 'policy', %s, %s, %s, %s, "
                     "CASE WHEN %s = 'completed' THEN now() END)",
                     (rollout_id, run_id, rollout_id.split("/")[1], status, 1.0 if status == "completed" else None,
                      messages // 2, parent if status == "completed" else None, status))
    return parent


async def _serve(url: str) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(make_app(url, lambda rid: workflow_url(UI, "default", rid)))
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


async def _shot(page, tmp_path: Path, name: str) -> None:
    path = tmp_path / f"view-{name}.png"
    await page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")


async def test_view_in_a_browser(gf, scripted, stack, run_id, tmp_path):
    from playwright.async_api import async_playwright

    await _seed(gf, scripted, run_id)
    long_run = run_id + "-long"
    _store_episode(stack.database_url, long_run, f"{long_run}/big/0", 120, status="completed", big=True)
    live_id = f"{long_run}/live/0"
    _store_episode(stack.database_url, long_run, live_id, 3, status="running", big=False)
    runner, base = await _serve(stack.database_url)
    try:
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = await browser.new_page(viewport={"width": 1400, "height": 1000})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))

            # Runs: counts by status, mean reward, pass@k.
            await page.goto(base + "/")
            row = page.locator(f'#runs tr[data-run="{run_id}"]')
            cells = [c.strip() for c in await row.locator("td").all_inner_texts()]
            assert cells[3:10] == ["4", "3", "1", "0", "0", "0.3333", "0.5"], cells  # task a solved, b not; c failed
            assert "vllm" in cells[2]
            await _shot(page, tmp_path, "runs")

            # Run: summary, plots, failures, checks (fetched after the page), profile, the table.
            await row.locator("a").click()
            await page.wait_for_selector("#checks")
            await page.wait_for_selector("#profile-line")
            assert (await page.inner_text("#mean-reward")).strip() == "0.3333"
            assert "context_length_exceeded" in await page.inner_text("#failure-types")
            assert await page.locator("#checks tr[data-check]").count() >= 8
            assert "solved 0, mixed 1, unsolved 1, unscored 1" in await page.inner_text("#profile-line")
            await page.wait_for_load_state("load")  # the plot images included
            widths = await page.locator(".plots img").evaluate_all("imgs => imgs.map(i => i.naturalWidth)")
            assert len(widths) == 4 and all(w > 0 for w in widths), widths
            assert "4 rollouts match" in await page.inner_text("#matching")
            await _shot(page, tmp_path, "run")

            # Filter (status completed), then sort by reward (descending on the second click), then page by 2.
            await page.select_option('select[name="status"]', "completed")
            await page.click("#apply")
            await page.wait_for_url(re.compile(r"status=completed"))
            assert "3 rollouts match" in await page.inner_text("#matching")
            await page.click('a[data-sort="reward"]')
            await page.wait_for_url(re.compile(r"sort=reward"))
            await page.click('a[data-sort="reward"]')
            await page.wait_for_url(re.compile(r"dir=desc"))
            rewards = [r.strip() for r in await page.locator("#rollouts td.reward").all_inner_texts()]
            assert rewards == ["1", "0", "0"], rewards
            await page.goto(page.url + "&size=2")
            assert len(await page.locator("#rollouts tr.rollout").all()) == 2
            await page.click("#next")
            await page.wait_for_url(re.compile(r"page=2"))
            ids = await page.locator("#rollouts tr.rollout a.id").all_inner_texts()
            assert len(ids) == 1 and "page 2 of 2" in await page.inner_text(".pager")

            # Rollout a/0: the conversation, the verifier, the Temporal link, tokens fetched when opened.
            rid = f"{run_id}/a/0"
            await page.goto(f"{base}/runs/{run_id}?task=a&sample=0")
            await page.click(f'#rollouts a.id:text-is("{rid}")')
            await page.wait_for_selector("#rollout-head")
            body = await page.inner_text("body")
            assert "It is cold in SF." in body and "get_weather" in body and '"city": "SF"' in body
            assert "The weather in SF is cold." in body  # the tool's result
            roles = await page.locator(".msg").evaluate_all("ms => ms.map(m => m.dataset.role)")
            assert roles[-4:] == ["user", "assistant", "tool", "assistant"], roles
            assert "called_get_weather" in await page.inner_text("#score-details")
            assert await page.get_attribute("#temporal-ui", "href") == workflow_url(UI, "default", rid)
            assert await page.locator("#review").count() == 1
            await page.locator("details.tokens >> nth=1").locator("summary").click()
            await page.wait_for_selector('details.tokens[data-ready="1"] table.token-table')
            token_rows = await page.locator('details.tokens[data-ready="1"] table.token-table tr').count()
            assert token_rows == 1 + len("It is cold in SF.".split())  # header + one row per generated token
            await _shot(page, tmp_path, "rollout")

            # A review: a label that cannot be stored says why and keeps what was typed; a good one is listed, the
            # verifier's reward unchanged; the run's agreement page counts it.
            assert "not reviewed yet" in await page.inner_text("#review")
            await page.fill('#review-form input[name="reviewer"]', "alice")
            await page.check('#review-form input[value="wrong"]')
            await page.fill('#review-form input[name="reward"]', "abc")
            await page.fill('#review-form textarea[name="comment"]', "<b>not bold</b> the tool was not needed")
            async with page.expect_navigation():
                await page.click("#review-submit")
            assert "reward: 'abc' is not a number" in await page.inner_text("#review-problem")
            assert await page.input_value('#review-form input[name="reviewer"]') == "alice"
            await page.fill('#review-form input[name="reward"]', "0")
            await page.fill('#review-form input[name="tags"]', "format, tools")
            async with page.expect_navigation():
                await page.click("#review-submit")
            label = await page.inner_text("#labels tr.label")
            assert "alice" in label and "wrong" in label and "<b>not bold</b>" in label and "format, tools" in label
            assert (await page.inner_text("#reward")).strip() == "1"
            await page.click("#agreement-link")
            table = page.locator('table.agreement[data-env="single_tool"]')
            assert (await table.locator("td.precision").inner_text()).strip() == "0"  # its one pass: a false pass
            assert rid in await page.locator("a.fp").all_inner_texts()
            await _shot(page, tmp_path, "agreement")
            forged = await page.request.post(f"{base}/rollouts/{quote(rid, safe='')}/review",
                                             form={"token": "guess", "reviewer": "mallory", "verdict": "right"})
            assert forged.status == 403, "a post without this server's form token is refused"

            # Model output with a script tag and a NUL: shown as text, never run.
            await page.goto(f"{base}/rollouts/{quote(f'{run_id}/b/0', safe='')}")
            shown = await page.locator(".role-assistant pre.content").last.inner_text()
            assert "<script>window.pwned=1</script>" in shown and "\ufffdafter the nul" in shown
            assert await page.evaluate("typeof window.pwned") == "undefined"
            await _shot(page, tmp_path, "hostile")

            # A long episode: 120 messages in pages of 50; a 10 MB message cut, with its full text a link away.
            big_url = f"{base}/rollouts/{quote(f'{long_run}/big/0', safe='')}"
            await page.goto(big_url)
            assert "messages 1–50 of 120" in await page.inner_text("#conversation-range")
            link = page.locator("#m3 a.full-text")
            assert re.search(r"10,?4\d\d,?\d{3}|\d+ more characters", await link.inner_text())
            full = await page.request.get(base + await link.get_attribute("href"))
            assert full.headers["content-type"].startswith("text/plain") and len(await full.text()) == BIG
            await page.click('a.page-link:text-is("3")')
            await page.wait_for_selector("#m119")
            assert "messages 101–120 of 120" in await page.inner_text("#conversation-range")
            await _shot(page, tmp_path, "long")

            # A running episode reloads by itself when a message is stored.
            await page.goto(f"{base}/rollouts/{quote(live_id, safe='')}")
            await page.wait_for_selector("#live-note")
            with psycopg.connect(stack.database_url, autocommit=True) as conn:
                conn.execute("INSERT INTO messages (rollout_id, parent_id, position, producer, producer_index, role, "
                             "body) SELECT %s, max(id), 3, 'test', 3, 'assistant', "
                             "'{\"role\": \"assistant\", \"content\": \"a new turn\"}' FROM messages "
                             "WHERE rollout_id = %s", (live_id, live_id))
            await page.wait_for_selector("#m3:has-text('a new turn')", timeout=15_000)

            # Unknown ids: 404 pages that name them.
            missing = await page.goto(f"{base}/runs/no-such-run")
            assert missing.status == 404 and "no-such-run" in await page.inner_text("#not-found")
            bad = f"{run_id}/nope/0"
            missing = await page.goto(f"{base}/rollouts/{quote(bad, safe='')}")
            assert missing.status == 404 and bad in await page.inner_text("#not-found")
            assert f"{run_id}/a/0" in await page.inner_text("body")  # names ids that exist
            await _shot(page, tmp_path, "not-found")
            assert not errors, errors
            await browser.close()
    finally:
        await runner.cleanup()
