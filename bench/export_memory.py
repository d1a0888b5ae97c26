"""Is `gymflow export` memory flat in the number of rollouts? Inserts two synthetic runs by SQL (a small one and
one 10x larger: two-turn rollouts with token ids, logprobs and a transcript), exports each in every format in
a fresh process, and prints that process's peak RSS above its baseline as a markdown table for
docs/training.md. Flat means the large run's peak is about the small run's.

    python bench/export_memory.py --rollouts 20000            # embedded Postgres in a temp folder
    python bench/export_memory.py --database-url postgresql://...   # an existing, disposable database
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[1]

# Two turns per rollout, stored as the episode stores them (migration 0008): a chain of messages (user,
# assistant with token data, tool, assistant) and the row naming its head. Turn 1's prompt extends turn 0's
# prompt + generation, so RL records are whole.
_MESSAGE = "INSERT INTO messages (rollout_id, parent_id, position, producer, producer_index, role, body, tokens)"
_INSERT = f"""
WITH s AS (SELECT g AS i, %(run)s || '/' || (g %% %(tasks)s)::text || '/' || (g / %(tasks)s)::text AS id,
                  (g %% %(tasks)s)::text AS task, g / %(tasks)s AS sample
           FROM generate_series(0, %(n)s - 1) g),
m0 AS ({_MESSAGE}
  SELECT id, NULL::bigint, 0, 'bench/0', 0, 'user', jsonb_build_object('role', 'user', 'content', repeat('q', 400)),
         NULL::jsonb FROM s RETURNING id, rollout_id),
m1 AS ({_MESSAGE}
  SELECT m0.rollout_id, m0.id, 1, 'bench/1', 0, 'assistant',
         jsonb_build_object('role', 'assistant', 'content', repeat('a', 400)),
         jsonb_build_object('attempt', 1, 'model', 'policy', 'prompt_token_ids', p.p0, 'generation_token_ids', p.g0,
                            'generation_log_probs', p.lp)
  FROM m0, p RETURNING id, rollout_id),
m2 AS ({_MESSAGE}
  SELECT m1.rollout_id, m1.id, 2, 'bench/2', 0, 'tool', jsonb_build_object('role', 'tool', 'content', 'ok'), NULL::jsonb
  FROM m1 RETURNING id, rollout_id),
m3 AS ({_MESSAGE}
  SELECT m2.rollout_id, m2.id, 3, 'bench/3', 0, 'assistant',
         jsonb_build_object('role', 'assistant', 'content', repeat('a', 400)),
         jsonb_build_object('attempt', 1, 'model', 'policy', 'prompt_token_ids', p.p0 || p.g0 || '[7, 8, 9]'::jsonb,
                            'generation_token_ids', p.g0, 'generation_log_probs', p.lp)
  FROM m2, p RETURNING id, rollout_id)
INSERT INTO rollout_rows (id, run_id, task_id, sample_index, env, model, status, reward, masked, turns, head_id)
SELECT s.id, %(run)s, s.task, s.sample, 'single_tool', 'policy', 'completed', (s.i %% 3) / 2.0, false, 2, m3.id
FROM s JOIN m3 ON m3.rollout_id = s.id
"""
_TOKENS = """
CREATE TEMP TABLE p AS SELECT
  (SELECT jsonb_agg(g) FROM generate_series(1, %(prompt)s) g) AS p0,
  (SELECT jsonb_agg(1000 + g) FROM generate_series(1, %(gen)s) g) AS g0,
  (SELECT jsonb_agg(-0.25) FROM generate_series(1, %(gen)s) g) AS lp
"""


def insert(url: str, run: str, n: int, prompt: int, gen: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS p")
        conn.execute(_TOKENS, {"prompt": prompt, "gen": gen})
        conn.execute("DELETE FROM rollout_rows WHERE run_id = %s", (run,))
        conn.execute("DELETE FROM messages WHERE rollout_id LIKE %s", (run + "/%",))
        conn.execute(_INSERT, {"run": run, "n": n, "tasks": max(n // 4, 1)})


def child(url: str, run: str, fmt: str, out: str) -> None:
    """Runs in a fresh process: baseline RSS after imports, then the export's peak."""
    from gymflow.kernel.store.db import make_engine, make_sessionmaker
    from gymflow.training.export import export_run

    def rss_mib() -> float:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    async def go() -> tuple[float, float, int, float]:
        engine = make_engine(url, pool_size=1)
        async with make_sessionmaker(engine)() as session:  # connect before the baseline
            await session.execute(__import__("sqlalchemy").text("SELECT 1"))
            base = rss_mib()
            started = time.monotonic()
            summary = await export_run(session, run, fmt, Path(out))
            took = time.monotonic() - started
        await engine.dispose()
        return base, rss_mib(), summary.rows, took

    base, peak, rows, took = asyncio.run(go())
    print(json.dumps({"base": base, "peak": peak, "rows": rows, "s": took}))


def measure(url: str, run: str, fmt: str, out: Path) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", run, fmt, str(out), "--database-url", url],
                          capture_output=True, text=True, cwd=ROOT, timeout=1800, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bench(url: str, n: int, prompt: int, gen: int) -> None:
    from gymflow.kernel.store.db import migrate

    migrate(url)
    small = max(n // 10, 1)
    for run, count in (("bench-small", small), ("bench-large", n)):
        insert(url, run, count, prompt, gen)
    print(f"{n} vs {small} rollouts, 2 turns, {prompt}+{gen} tokens a turn\n")
    print("| format | rollouts | rows written | export s | peak RSS above baseline (MiB) | file MiB |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in ("rl", "sft", "dpo"):
            for run, count in (("bench-small", small), ("bench-large", n)):
                out = Path(tmp) / f"{run}-{fmt}.parquet"
                m = measure(url, run, fmt, out)
                size = out.stat().st_size / 2**20
                print(f"| {fmt} | {count} | {m['rows']} | {m['s']:.1f} | {m['peak'] - m['base']:.0f} | {size:.2f} |",
                      flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=20_000)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--database-url")
    ap.add_argument("--child", nargs=3, metavar=("RUN", "FORMAT", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.database_url, *args.child)
        return
    if args.database_url:
        bench(args.database_url, args.rollouts, args.prompt_tokens, args.gen_tokens)
        return
    from gymflow.workers.local_stack import LocalStack

    with tempfile.TemporaryDirectory() as state:
        Path(state).chmod(0o755)  # embedded Postgres runs as its own user when we are root
        # A Temporal address is given so none is started: only Postgres is needed.
        with LocalStack(Path(state), temporal_address="unused:7233") as addresses:
            bench(addresses.database_url, args.rollouts, args.prompt_tokens, args.gen_tokens)


if __name__ == "__main__":
    main()
