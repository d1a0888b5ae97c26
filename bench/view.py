"""How fast does `gymflow view` answer on a large run? Inserts one synthetic run by SQL (100,000 two-turn rollouts by
default, stored as the episode stores them: a chain of 4 messages with token ids, logprobs and a policy version),
serves the view in this process and times each request from send to last byte, p50 and p95 over `--repeat`.

    python bench/view.py                       # embedded Postgres in a temp folder, 100,000 rollouts
    python bench/view.py --rollouts 20000 --database-url postgresql://...   # an existing, disposable database
    python bench/view.py --index               # also with CREATE INDEX ON rollout_rows (run_id, reward, id)

Pages: the run page (summary, failures, profile, first table page), filtered + sorted table pages (shallow and
deep), a rollout; then the run page's deferred parts, each timed cold (first request computes) and warm (cached).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import psycopg

RUN = "bench-view"
_MESSAGE = "INSERT INTO messages (rollout_id, parent_id, position, producer, producer_index, role, body, tokens)"
# Statuses, failure types, rewards, turns and latencies vary with the row number, so filters select real subsets.
_INSERT = f"""
WITH s AS (SELECT g AS i, %(run)s || '/t' || (g %% %(tasks)s)::text || '/' || (g / %(tasks)s)::text AS id,
                  't' || (g %% %(tasks)s)::text AS task, g / %(tasks)s AS sample
           FROM generate_series(0, %(n)s - 1) g),
m0 AS ({_MESSAGE}
  SELECT id, NULL::bigint, 0, 'bench/0', 0, 'user', jsonb_build_object('role', 'user', 'content', repeat('q', 300)),
         NULL::jsonb FROM s RETURNING id, rollout_id),
m1 AS ({_MESSAGE}
  SELECT m0.rollout_id, m0.id, 1, 'bench/1', 0, 'assistant',
         jsonb_build_object('role', 'assistant', 'content', NULL, 'tool_calls', jsonb_build_array(jsonb_build_object(
           'id', 'c1', 'type', 'function', 'function', jsonb_build_object('name', 'get_weather',
           'arguments', '{{"city": "SF"}}')))),
         jsonb_build_object('attempt', 1, 'model', 'policy', 'finish_reason', 'tool_calls', 'policy_version',
                            'v' || (right(m0.rollout_id, 1)::int %% 3)::text,
                            'usage', jsonb_build_object('prompt_tokens', 64, 'completion_tokens', 16),
                            'prompt_token_ids', p.p0, 'generation_token_ids', p.g0, 'generation_log_probs', p.lp)
  FROM m0, p RETURNING id, rollout_id),
m2 AS ({_MESSAGE}
  SELECT m1.rollout_id, m1.id, 2, 'bench/2', 0, 'tool', jsonb_build_object('role', 'tool', 'content', 'cold',
         'tool_call_id', 'c1', 'name', 'get_weather'), NULL::jsonb
  FROM m1 RETURNING id, rollout_id),
m3 AS ({_MESSAGE}
  SELECT m2.rollout_id, m2.id, 3, 'bench/3', 0, 'assistant',
         jsonb_build_object('role', 'assistant', 'content', repeat('a', 400)),
         jsonb_build_object('attempt', 1, 'model', 'policy', 'finish_reason', 'stop', 'policy_version', 'v1',
                            'usage', jsonb_build_object('prompt_tokens', 83, 'completion_tokens', 16),
                            'prompt_token_ids', p.p0 || p.g0 || '[7, 8, 9]'::jsonb,
                            'generation_token_ids', p.g0, 'generation_log_probs', p.lp)
  FROM m2, p RETURNING id, rollout_id)
INSERT INTO rollout_rows (id, run_id, task_id, sample_index, env, model, status, reward, masked, failure_type,
                          failure_message, turns, tool_calls, latency_s, started_at, finished_at, head_id)
SELECT s.id, %(run)s, s.task, s.sample, 'single_tool', 'policy',
       CASE WHEN s.i %% 17 = 3 THEN 'failed' ELSE 'completed' END,
       CASE WHEN s.i %% 17 = 3 THEN NULL ELSE (s.i %% 5) / 4.0 END, s.i %% 53 = 7,
       CASE WHEN s.i %% 17 = 3 THEN (ARRAY['model_bad_request', 'env_error', 'context_length_exceeded'])[s.i %% 3 + 1]
            WHEN s.i %% 53 = 7 THEN 'env_error' END,
       CASE WHEN s.i %% 17 = 3 THEN 'bench failure ' || (s.i %% 7)::text END,
       2 + s.i %% 4, 1, 0.5 + (s.i %% 997) / 100.0,
       now() - interval '1 hour' + s.i * interval '30 ms',
       now() - interval '1 hour' + s.i * interval '30 ms' + interval '3 s',
       m3.id
FROM s JOIN m3 ON m3.rollout_id = s.id
"""
_TOKENS = """
CREATE TEMP TABLE p AS SELECT
  (SELECT jsonb_agg(g) FROM generate_series(1, 64) g) AS p0,
  (SELECT jsonb_agg(1000 + g) FROM generate_series(1, 16) g) AS g0,
  (SELECT jsonb_agg(-0.25) FROM generate_series(1, 16) g) AS lp
"""
INDEX = "CREATE INDEX IF NOT EXISTS bench_view_run_reward ON rollout_rows (run_id, reward, id)"


def insert(url: str, n: int) -> float:
    started = time.monotonic()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS p")
        conn.execute(_TOKENS)
        conn.execute("DELETE FROM rollout_rows WHERE run_id = %s", (RUN,))
        conn.execute("DELETE FROM messages WHERE rollout_id LIKE %s", (RUN + "/%",))
        conn.execute(_INSERT, {"run": RUN, "n": n, "tasks": max(n // 8, 1)})
        conn.execute("ANALYZE rollout_rows")
        conn.execute("ANALYZE messages")
    return time.monotonic() - started


PAGES = {
    "run page (default sort, page 1)": f"/runs/{RUN}",
    "table: status=completed, reward>=0.5, sort reward desc": f"/runs/{RUN}?status=completed&reward_min=0.5&sort=reward"
                                                              "&dir=desc",
    "table: failure=env_error, sort latency desc, page 20": f"/runs/{RUN}?failure=env_error&sort=latency&dir=desc"
                                                            "&page=20",
    "table: turns>=4, sort reward asc, page 1000 (deep)": f"/runs/{RUN}?turns_min=4&sort=reward&page=1000",
    "table: policy=v2 (per-rollout message lookup), sort reward": f"/runs/{RUN}?policy=v2&sort=reward",
    "rollout page": f"/rollouts/{RUN}%2Ft5%2F3",
    "runs list": "/",
}
DEFERRED = {"health checks (fragment)": f"/runs/{RUN}/health", "plots (4 SVGs)": f"/runs/{RUN}/plots/reward.svg",
            "profile, latency, failure messages (fragment)": f"/runs/{RUN}/details"}


async def measure(url: str, repeat: int) -> None:
    from aiohttp.test_utils import TestClient, TestServer

    from gymflow.view.app import make_app

    client = TestClient(TestServer(make_app(url, lambda _rid: None)))
    await client.start_server()
    try:
        print("| request | first ms | p50 ms | p95 ms | bytes |\n|---|---|---|---|---|")
        for label, path in PAGES.items():
            times, size, first = [], 0, 0.0
            for i in range(repeat + 2):
                started = time.perf_counter()
                resp = await client.get(path)
                body = await resp.read()
                assert resp.status == 200, (path, resp.status, body[:300])
                took = 1000 * (time.perf_counter() - started)
                first = first or took
                if i >= 2:  # two warm-ups: connections, plans, the run's cached summary
                    times.append(took)
                size = len(body)
            q = statistics.quantiles(times, n=20)
            print(f"| {label} | {first:.0f} | {statistics.median(times):.0f} | {q[18]:.0f} | {size:,} |", flush=True)
        for label, path in DEFERRED.items():
            started = time.perf_counter()
            resp = await client.get(path)
            await resp.read()
            cold = 1000 * (time.perf_counter() - started)
            started = time.perf_counter()
            await (await client.get(path)).read()
            warm = 1000 * (time.perf_counter() - started)
            print(f"| {label} | {cold:.0f} | {warm:.0f} (cached) | | |", flush=True)
    finally:
        await client.close()


def bench(url: str, n: int, repeat: int, index: bool) -> None:
    from gymflow.kernel.store.db import migrate

    migrate(url)
    took = insert(url, n)
    print(f"{n:,} rollouts of run {RUN} (4 messages each) inserted in {took:.0f} s; {repeat} timed requests each\n")
    asyncio.run(measure(url, repeat))
    if index:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(INDEX)
            conn.execute("ANALYZE rollout_rows")
        print(f"\nwith {INDEX.split(' ON ')[1]} (this database only; no migration adds it):\n")
        asyncio.run(measure(url, repeat))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--index", action="store_true", help="measure again with an index on (run_id, reward, id)")
    ap.add_argument("--database-url")
    args = ap.parse_args()
    if args.database_url:
        bench(args.database_url, args.rollouts, args.repeat, args.index)
        return
    from gymflow.workers.local_stack import LocalStack

    with tempfile.TemporaryDirectory() as state:
        Path(state).chmod(0o755)  # embedded Postgres runs as its own user when we are root
        with LocalStack(Path(state), temporal_address="unused:7233") as addresses:
            bench(addresses.database_url, args.rollouts, args.repeat, args.index)


if __name__ == "__main__":
    main()
