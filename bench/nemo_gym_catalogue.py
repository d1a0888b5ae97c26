"""Measured coverage of NeMo Gym 0.7.0's catalogue: every installed resources server's recorded rollouts, scored by
NeMo Gym's own server code and by gymflow's full stack, row by row.

    python -m bench.nemo_gym_catalogue                                  # every server (~25 min on 2 cores)
    python -m bench.nemo_gym_catalogue --servers xlam_fc,math_with_judge
    python -m bench.nemo_gym_catalogue --resume                         # skip servers already done

For each server of the catalogue (environments/nemo_gym_catalogue.py) with a `data/example_rollouts.jsonl`:

NeMo Gym's verdict: the server started by NeMo Gym's own code (`python app.py` under NeMo Gym's Python with the
config `ng_run` hands its children: environments/nemo_gym_launch.py), driven as NeMo Gym's simple agent drives it
(responses_api_agents/simple_agent/app.py `run`): POST /seed_session with the row, each recorded function call to
POST /<tool> in the session (a stateful server's verify reads what they did), then POST /verify with the row and its
recorded `response` (every output item), with the session's cookies; `reward` of the reply.

gymflow's verdict: the same rows through gymflow's stack (Temporal dev server, embedded Postgres, the three pools as
`gymflow worker` processes) on the `nemo_gym` environment, whose env pool starts its own copy of the server; the
model is a recorded one (`recorded: FILE`), which replays the row's `response.output` turn by turn, so the tool calls
run on the server again and the verify request is built by gymflow from its own transcript.

gymflow's rows are the rollout file joined with the server's `example.jsonl`, as `gymflow data join` writes them
(gymflow.data.prepare.join: task fields the rollout rows omit, sample numbering, replay fields). NeMo Gym's row is
the request its agent sent, as its own `reverify` rebuilds it: the rollout row (the verify reply, which echoes the
request) less the reply's own fields and the nulls of its `responses_create_params` dump, over the same task. A
recording that ends on a tool call (a single-step agent) is replayed with that many turns.

Servers whose config calls a model (a judge) get the same fake judge on both sides, through the overrides
(`gymflow_model_urls`): an OpenAI-compatible Responses/Chat server answering every request with one fixed verdict
(JUDGE_VERDICT). Results go to one JSON file per server under --work as they finish (`--resume` skips those);
docs/nemo-gym-catalogue.md is written from them (`--render-only`: from those there are).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from gymflow.environments import nemo_gym_catalogue as catalogue
from gymflow.environments import nemo_gym_server as managed

from bench.catalogue_doc import render
from bench.catalogue_plan import (
    BATCH,
    DOC,
    INSTALLED,
    NEMO_PYTHON,
    SERVER_TIMEOUT_S,
    START_TIMEOUT_S,
    WORK,
    Plan,
    plan,
    start_judge,
)
from bench.catalogue_verdicts import Stack, compare, gymflow_verdicts, nemo_verdicts
from gymflow.client import GymflowClient

# ---- one server -----------------------------------------------------------------------------------------------


async def _bounded(what: str, coro: Any, timeout: float) -> dict[str, Any]:
    try:
        return await asyncio.wait_for(coro, timeout)
    except TimeoutError:
        return {"start_error": f"{what}: no verdict within {timeout:g} s (--timeout)", "rows": []}


async def run_server(p: Plan, client: GymflowClient | None, model: str, timeout: float) -> dict[str, Any]:
    t0 = time.monotonic()
    result: dict[str, Any] = {"server": p.server, "judge": p.judge, "notes": p.notes, "agents": p.agents,
                              "not_runnable": p.not_runnable, "rows": []}
    if p.not_runnable is None:
        nemo = await _bounded("NeMo Gym", nemo_verdicts(p), timeout)
        result["reply_only"] = nemo.get("reply_only", [])
        if nemo.get("start_error"):
            result["not_runnable"] = f"NeMo Gym's own server: {nemo['start_error']}"
        if nemo.get("rows") and any("error" not in r for r in nemo["rows"]) and client is not None:
            gym = await _bounded("gymflow", gymflow_verdicts(client, p, model), timeout)
            if gym.get("start_error"):
                result["gymflow_error"] = gym["start_error"]
        else:
            gym = {"rows": []}
        result["rows"] = compare(p, nemo, gym)["rows"]
        if result["rows"] and all(r["verdict"] == "not runnable" for r in result["rows"]):
            result["not_runnable"] = result["not_runnable"] or "NeMo Gym's own server fails every row"
    result["wall_s"] = round(time.monotonic() - t0, 1)
    return result


def _save(work: Path, result: dict[str, Any]) -> None:
    out = work / "results" / f"{result['server']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1, default=str))
    tmp.replace(out)


def _done(work: Path) -> set[str]:
    return {f.stem for f in (work / "results").glob("*.json")}


async def run_batch(plans: list[Plan], work: Path, parallel: int, timeout: float) -> None:
    runnable = [p for p in plans if p.not_runnable is None]
    for p in plans:
        if p.not_runnable is not None:
            _save(work, await run_server(p, None, "", timeout))
    if not runnable:
        return
    models = {f"rec_{p.server}": p.file for p in runnable if p.file is not None}
    stack = Stack(work / "stacks" / time.strftime("%H%M%S"), models)
    client = await stack.start()
    slots = asyncio.Semaphore(parallel)

    async def one(p: Plan) -> None:
        async with slots:
            print(f"  {p.server}: {len(p.rows)} rows{' (judge)' if p.judge else ''}", file=sys.stderr, flush=True)
            result = await run_server(p, client, f"rec_{p.server}", timeout)
            _save(work, result)
            print(f"  {p.server}: {Counter(r['verdict'] for r in result['rows'])} {result['wall_s']} s"
                  f"{' - ' + result['not_runnable'][:120] if result['not_runnable'] else ''}", file=sys.stderr,
                  flush=True)
    try:
        await asyncio.gather(*(one(p) for p in runnable))
    finally:
        await stack.close()


# ---- main -----------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.nemo_gym_catalogue", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", help="comma-separated server names (default: every installed one)")
    ap.add_argument("--limit", type=int, help="at most this many servers (after --servers and --resume)")
    ap.add_argument("--rows", type=int, help="at most this many rows per server")
    ap.add_argument("--resume", action="store_true", help="skip servers with a result under --work")
    ap.add_argument("--parallel", type=int, default=2, help="servers at once (the machine has 2 cores)")
    ap.add_argument("--timeout", type=float, default=SERVER_TIMEOUT_S, help="seconds per side per server")
    ap.add_argument("--work", type=Path, default=WORK)
    ap.add_argument("--doc", type=Path, default=DOC)
    ap.add_argument("--render-only", action="store_true", help="write the document from the results there are")
    ap.add_argument("--install", action="store_true",
                    help="first install INSTALLED's own requirements into the NeMo Gym venv (gymflow env "
                         "nemo-gym-install)")
    args = ap.parse_args(argv)
    os.environ.setdefault(catalogue.PYTHON_ENV, str(NEMO_PYTHON))
    if args.install:
        from gymflow.environments.nemo_gym_install import install_servers

        install_servers(INSTALLED, Path(os.environ[catalogue.PYTHON_ENV]))
    os.environ[managed.START_TIMEOUT_ENV] = START_TIMEOUT_S
    import logging
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("temporalio").setLevel(logging.ERROR)
    servers = catalogue.catalogue(catalogue.python())
    names = list(servers) if not args.servers else [s.strip() for s in args.servers.split(",") if s.strip()]
    unknown = [n for n in names if n not in servers]
    if unknown:
        raise SystemExit(f"not installed NeMo Gym servers: {', '.join(unknown)}")
    command = "python -m bench.nemo_gym_catalogue" + (" " + " ".join(argv if argv is not None else sys.argv[1:])
                                                      if (argv if argv is not None else sys.argv[1:]) else "")
    if not args.render_only:
        todo = [n for n in names if not (args.resume and n in _done(args.work))]
        todo = todo[: args.limit] if args.limit else todo
        judge, judge_url = start_judge()
        try:
            plans = [plan(servers[n], args.work, judge_url, args.rows) for n in todo]
            asyncio.run(run_batch([p for p in plans if p.not_runnable], args.work, args.parallel, args.timeout))
            plans = [p for p in plans if not p.not_runnable]
            for i in range(0, len(plans), BATCH):
                batch = plans[i:i + BATCH]
                print(f"batch {i // BATCH + 1}: {', '.join(p.server for p in batch)}", file=sys.stderr, flush=True)
                asyncio.run(run_batch(batch, args.work, args.parallel, args.timeout))
                args.doc.write_text(render(args.work, list(servers), command))
        finally:
            judge.shutdown()
    args.doc.write_text(render(args.work, list(servers), command))
    print(f"wrote {args.doc}", file=sys.stderr)


if __name__ == "__main__":
    main()
