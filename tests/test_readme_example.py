"""The README's "From Python:" block runs as written against the test stack; the facade stays lazy; a group's
members come back as token-exact training records, with no SQL in the caller."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys

import pytest

import gymflow
from gymflow.testing.scripted_openai import Reply, weather_responder
from gymflow.training.iterator import iterate_groups
from tests.conftest import ROOT


def readme_python_block() -> str:
    text = (ROOT / "README.md").read_text()
    found = re.search(r"From Python[^\n]*\n\n```python\n(.*?)```", text, re.S)
    assert found, "README.md has no ```python block after 'From Python'"
    return found.group(1)


def test_import_gymflow_is_cheap_and_every_name_resolves():
    code = ("import sys, gymflow; heavy = [m for m in sys.modules if m.startswith(('gymflow.', 'temporalio', "
            "'sqlalchemy', 'httpx', 'pydantic'))]; assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)
    assert sorted(gymflow.__all__) == sorted(gymflow._WHERE)
    for name in gymflow.__all__:
        assert getattr(gymflow, name) is not None, name
    with pytest.raises(AttributeError, match="no_such_name"):
        gymflow.no_such_name  # noqa: B018


def test_readme_block_is_a_script():
    code = readme_python_block()
    compile(code, "README.md", "exec")  # no top-level await
    assert "gymflow.connect()" in code and "with " in code and '"readme-run"' in code


@pytest.mark.integration
async def test_readme_example_runs(workers, config_file, scripted):
    """The pools of `workers` run on this test's loop: the script waits in a thread, so they keep polling."""
    scripted.responder = weather_responder
    try:
        env = {**os.environ, "GYMFLOW_CONFIG": str(config_file)}
        done = await asyncio.to_thread(subprocess.run, [sys.executable, "-c", readme_python_block()], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=240)
    finally:
        scripted.responder = None
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("readme-run/")]
    assert len(lines) == 10 and all(" completed " in line for line in lines), done.stdout[-4000:]


@pytest.mark.integration
async def test_group_records_are_token_exact(gf, scripted, run_id):
    reply = Reply(content="done", logprobs=True, token_ids=[7, 8, 9], completion_tokens=3, prompt_tokens=4)
    scripted.script(reply, reply)
    tasks, errors = gymflow.load_jsonl(ROOT.parent / "shared/data/nemo_gym/example_single_tool_call/example.jsonl",
                                       env="single_tool")
    assert not errors
    groups = [g async for g in iterate_groups(gf, run_id, tasks[:1], n=2, model="vllm", shuffle=False)]
    assert len(groups) == 1
    records = await groups[0].records(gf)
    assert [r.rollout_id for r in records] == [m.rollout_id for m in groups[0].members]
    for r in records:
        assert r.trainable and [t.turn for t in r.turns] == [0]
        assert r.sequence.input_ids[-3:] == [7, 8, 9] and r.sequence.loss_mask[-3:] == [1, 1, 1]
    assert await gymflow.group_records(gf, []) == []
