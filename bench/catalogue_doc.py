"""docs/nemo-gym-catalogue.md from the catalogue bench's results: why each server is what it is, what the table
shows, the table (bench/nemo_gym_catalogue.py)."""

from __future__ import annotations

import json
import os
import platform
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

from gymflow.environments import nemo_gym_catalogue as catalogue

from bench.catalogue_plan import INSTALLED, JUDGE_VERDICT

# ---- the document ---------------------------------------------------------------------------------------------

# Why each disagreement or not-runnable server is what it is, from reading its rows, log and code (the bench's
# own evidence is appended: the NeMo Gym error, gymflow's failure, the rewards).
EXPLAINED: dict[str, str] = {
    "example_tool_call_multireward": (
        "gymflow by design: NeMo Gym's reward is 2.0 (a sum of reward components, = recorded); gymflow records "
        "rewards in [0, 1] and masks one outside (environments/nemo_gym.py `_score`, verifier_failed)"),
    "generative_reward_model": (
        "gymflow by design: NeMo Gym's reward is -1 on 4 rows (= recorded; its scale is [-1, 1]); gymflow records "
        "rewards in [0, 1] and masks one outside (environments/nemo_gym.py `_score`, verifier_failed); the row "
        "scored 1 agrees"),
}
EXPLAINED |= {
    "competitive_coding_challenges": (
        "data not shipped: at start-up it pre-loads ~27 GB of test metadata it does not ship; /health did not answer "
        "within 150 s"),
    "critpt": (
        "needs the network: it scores by calling the Artificial Analysis API (`api_key` unset: its config fails "
        "validation); its own critpt_agent, not the simple agent, drives it"),
    "osworld": "needs $OSWORLD_RESOURCES_TOKEN and the OSWorld desktop VMs it drives (start-up fails without it)",
    "vibench": ("data not shipped: /seed_session reads PRDs from $VIBENCH_REPO_ROOT (`/nonexistent/set-VIBENCH_REPO_"
                "ROOT/prds/...`: FileNotFoundError)"),
    "vlm_eval_kit": "needs the network: at start-up it `git clone`s VLMEvalKit into its venv",
    "bigcodebench": "needs the network: at start-up it builds a venv of its own with uv (not installed) from PyPI",
    "legal_agent_bench": ("needs the network: at start-up it downloads harvey-labs from GitHub; its example.jsonl "
                          "rows have an empty `input`"),
    "image_tools": (
        "NeMo Gym's own schema rejects the rollout file: its recorded `response` objects lack `created_at`, which "
        "NeMo Gym's `NeMoGymResponse` requires (/verify 422 on every row)"),
    "workplace_assistant": (
        "data not shipped: the rollouts are of tasks example.jsonl does not hold and carry no `ground_truth`, "
        "which /verify requires (422); gymflow's tests/workplace_gold.py writes those five by hand"),
}
# Where NeMo Gym's own verdict is not its recording (both sides agree): the recording is what is off.
EXPLAINED |= {
    "lc_niah": (
        "NeMo Gym's recording is off, not its code: the rows were recorded with the LCS overlap metric "
        "(`reasoning_overlap` = `overlap_lcs`, reward = answer_score × (1 − 0.012...)); the shipped config selects "
        "16-gram overlap (`overlap_metric_rule: ngram16`, 0.0 on these rows), so NeMo Gym 0.7.0 scores "
        "answer_score itself, and gymflow with it"),
    "math_with_code": (
        "row 4: NeMo Gym's recording is off: it recorded `extracted_answer: \\sqrt{2` (cut at the nested brace "
        "of the final `\\boxed{\\sqrt{2}}`) and reward 0; NeMo Gym 0.7.0 extracts `\\sqrt{2}` and scores 1, and "
        "gymflow with it"),
}
# NeMo Gym runs these with its gymnasium agent (/reset, /step): both sides drive that protocol (the bench's
# `_nemo_gymnasium`, gymflow's environments/nemo_gym_gymnasium.py). example_multi_turn_gymnasium agrees on every row.
EXPLAINED |= {
    "wordle": ("data not shipped: /reset reads data/guesses.txt, which the wheel lacks (its generate_data.py "
               "writes it): HTTP 500 on every row"),
    "indian_banking": ("data not shipped: /reset reads data/db.json and kb.json, from the Hugging Face dataset "
                       "NPCI/nemo-gym-indian-banking, which the wheel lacks: HTTP 500 on every row"),
    "openair_congestion": (
        "gymflow by design: the step rewards are negative (congestion penalties); gymflow's reward is NeMo Gym's "
        "to the last digit (its masked detail says it) and masked as outside [0, 1]. NeMo Gym 0.7.0's own verdict "
        "is not its recording (about half of it: the recording's reward terms are not the shipped code's)"),
    "grl_sokoban": (
        "gymflow by design: the rewards are Sokoban's (-0.1 a move, +10 solved); gymflow's reward is NeMo Gym's to "
        "the last digit on every row (its masked detail says it) and masked as outside [0, 1]. The five tasks share "
        "one prompt and differ only in `seed`: matched by prompt, every rollout got one task's seed and another "
        "board (found here; `gymflow data join` now matches by `_ng_task_index` and takes the task's prompt where "
        "the recording holds /reset's observation)"),
    "grl_tetris": (
        "gymflow by design: rewards outside [0, 1] (masked), as grl_sokoban; gymflow's reward equals the recorded "
        "one on every row. Not reproducible in general: the seed covers /reset only; the pieces after the first "
        "are drawn from the server process's unseeded global `random` (tetris_env.py:134-147), so a replay gets "
        "its recording's pieces by chance (NeMo Gym's own verdict is not its recording on three rows)"),
    "math_with_judge": (
        "NeMo Gym scores math-verify's own timeout 0: its `math_metric` calls math-verify's `verify` with that "
        "library's default 5 s limit (signal.alarm; grader.py `timeout_seconds=5`), which answers False when it "
        "passes; row 1's check (a (2+sqrt 3)^2016 closed form) takes 4.97 s alone on this machine, so with any other "
        "load NeMo Gym's verdict on it is 0 (recorded 1): in the full run of 2026-12-07 12:06 it was, and this row "
        "was rerun alone (`--servers math_with_judge`). Both sides run that server code, so either can read 0; "
        "gymflow's own math_with_judge environment turns math-verify's timeouts off and "
        "bounds the check itself, masking one past its limit. The other rows agree every time"),
    "blackjack": (
        "not reproducible: /reset deals from an unseeded `random.Random()`, so each side plays another hand with "
        "the recorded actions (NeMo Gym's own verdict is not its recording on every row either); a loss (-1) is "
        "outside [0, 1], which gymflow masks by design"),
}
EXPLAINED["example_mcp_weather"] = (
    "tools over MCP: the rows offer none (`tools: []`); the server's config sets `expose_tools_over_mcp`, so "
    "gymflow seeds at setup and offers what the endpoint /seed_session announces lists (`get_weather`), as NeMo "
    "Gym's MCP agents list it")
# Image prompts (`input_image` parts) load as Chat Completions image parts and go back to /verify as recorded.
for _name in ("circle_click", "circle_count", "gui_coordinate"):
    EXPLAINED[_name] = "image prompts (`input_image` parts), sent back to /verify as recorded"
# What the table shows, in short (written from the results; keep it true when they change).
FINDINGS = [
    "What it shows:",
    "",
    "- Every disagreement is a gymflow choice, none a wrong score: rewards outside [0, 1] "
    "(example_tool_call_multireward 2.0, generative_reward_model -1, the gymnasium servers' penalties: gymflow "
    "masks them by design) and unseeded environments (blackjack). Image prompts (circle_click, circle_count, "
    "gui_coordinate: `input_image` parts) and tools listed over MCP (example_mcp_weather: the rows offer none, the "
    "server's endpoint lists `get_weather`) were gymflow gaps until the loader took image parts and the adapter "
    "listed MCP tools; they agree on every row.",
    "- NeMo Gym's gymnasium agent (`/reset`, `/step`) is spoken by the adapter: example_multi_turn_gymnasium "
    "agrees on every row; grl_sokoban, grl_tetris and openair_congestion give NeMo Gym's reward to the digit, "
    "masked as outside [0, 1]; blackjack deals unseeded hands; wordle and indian_banking lack their data.",
    "- Sandboxes (the issue's item 7): a server whose config configures its provider in place (litmus_agent: "
    "opensandbox, for its code-exec tool) gets gymflow's sandbox in its place (environments/"
    "nemo_gym_sandbox_provider.py, registered with NeMo Gym's provider registry: each exec in bubblewrap, no "
    "network, the host's /usr; plain Python images only; tests/test_nemo_gym_sandbox.py) and agrees on every row. "
    "The other twelve name a provider by reference and run every row in its own prebuilt image (the SWE and "
    "terminal servers: one docker.io image per row), a node image driven by a harness agent (workspace_bench) or "
    "a Lean server (math_formal_lean): no local stand-in holds those offline, so they stay refused (0 more).",
    "- NeMo Gym scores a timeout 0: math_with_judge's verifier leaves math-verify's own 5 s limit in place, which "
    "answers False when it passes; row 1's check takes 4.97 s alone here, so under any load NeMo Gym's verdict on "
    "it is 0 (recorded 1), measured with two busy loops beside it. gymflow's own math_with_judge environment turns "
    "that limit off and bounds the check in its own process (a timeout masked, never 0).",
    "- Adapter bugs this bench found, fixed with tests: a replayed rollout row sent its recorded outcome "
    "(`reward`, `judge_evaluations`, ...) back to /verify, which servers that build their reply as "
    "`Reply(**body.model_dump(), reward=r)` answered with HTTP 500 (equivalence_llm_judge; "
    "tests/test_nemo_gym_recorded_rows.py); a judge model could not be given to a managed server (now "
    "`gymflow_model_urls` in `resources_server_overrides`; tests/test_nemo_gym_launch_models.py); a config file "
    "with a top-level list (critpt's `config_paths`) stopped the launcher; rollouts of tasks that share a "
    "prompt (grl_*: a seed apart) were matched to one such task (tests/test_recorded_samples.py).",
    "- Where NeMo Gym is wrong: its rollout files are not re-verifiable as shipped: every row echoes "
    "`responses_create_params` with its unset fields as null (`parallel_tool_calls: null`), which NeMo Gym's own "
    "request model rejects (422), so the bench prunes the nulls, as NeMo Gym's `reverify` avoids them by reading the "
    "materialized inputs instead; image_tools' recorded responses lack `created_at` (422 on every row); four servers "
    "ship rollouts of tasks their example.jsonl does not hold, without the fields /verify needs; four ship "
    "placeholder rollout files (`<PLACEHOLDER ROW>`); four ship rows without a `response`; lc_niah and "
    "math_with_code row 4 were recorded with scoring that NeMo Gym 0.7.0 no longer does (see their rows).",
    "- Servers' own packages: with `gymflow env nemo-gym-install` run on the 26 servers in INSTALLED (index "
    "packages only, nothing from git, no torch), 16 more servers agree on every row (48 before). The other ten then "
    "stop for reasons beyond packages: start-up downloads (evalplus and ether0 fetch data, newton_bench `git "
    "clone`s), rewards outside [0, 1] (grl_sokoban and grl_tetris, since the adapter speaks gymnasium_agent), "
    "another agent's protocol (scicode, gdpval, toolsandbox: their own agents build the prompt, the rows' `input` "
    "is empty), NeMo Gym's own request model "
    "rejecting its recorded `usage` (mrcr, ruler2), rollouts of tasks example.jsonl lacks (structured_outputs).",
    "- Rollout files concatenated from several collections (graphwalks repeats task 11's sample 0; iheval gives "
    "`id: 1` to two prompts) were refused by gymflow's loader as duplicates; `gymflow data join` now numbers a "
    "repeated sample as the task's next one and gives a reused id its own (`<id>-line<N>`), and both agree.",
    "- Reproducible: a second full run (17 minutes on this 2-core machine) gave the same verdict, the same NeMo Gym "
    "reward and the same gymflow reward on every row of every server.",
    "- The bench replays a recording that ends on a tool call or its output (a single-step agent) with that many "
    "turns, as NeMo Gym's agent stopped there (single_step_tool_use_with_argument_comparison row 1, circle_click).",
]
# The class of why a server is not runnable, where the refusal or the error does not say it (see `reason`).
REASONS: dict[str, str] = {
    "competitive_coding_challenges": "data not shipped", "critpt": "needs the network", "vibench": "data not shipped",
    "osworld": "config values nobody set", "vlm_eval_kit": "needs the network", "bigcodebench": "needs the network",
}


def _num(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _short(text: str, n: int = 220) -> str:
    text = re.sub(r"\s+", " ", text or "").strip()
    text = re.sub(r"/\S*?/site-packages/", "", text)  # the venv's paths say nothing the server's name does not
    text = re.sub(r"/\S*?/rows/(\S+?\.jsonl)", r"\1", text)
    return text if len(text) <= n else text[: n - 1] + "…"


def _why(result: dict[str, Any]) -> str:
    parts = []
    if result["server"] in EXPLAINED:
        parts.append(EXPLAINED[result["server"]])
    if result.get("not_runnable") and result["server"] not in EXPLAINED:
        parts.append(_short(result["not_runnable"], 300))
    rows = result["rows"]
    bad = [r for r in rows if r["verdict"] == "not runnable"]
    agents = result.get("agents") or []
    if bad and agents and "simple_agent" not in agents and result["server"] not in EXPLAINED:
        parts.append(f"its config allows only the agent(s) {', '.join(agents)}, not the simple agent whose "
                     "seed/verify protocol both sides speak")
    if bad:
        parts += [_short(n, 160) for n in result.get("notes") or []]
    if bad and not result.get("not_runnable"):
        n = bad[0]["nemo_gym"]
        parts.append(f"NeMo Gym fails {len(bad)} row(s): {_short(n.get('log') or n.get('error', ''), 200)}")
    elif bad and result["server"] not in EXPLAINED and bad[0]["nemo_gym"].get("error", "")[:60] not in \
            (result.get("not_runnable") or ""):
        n = bad[0]["nemo_gym"]
        parts.append(f"NeMo Gym: {_short(n.get('log') or n.get('error', ''), 200)}")
    groups: dict[str, list[str]] = {}
    for r in rows:
        if r["verdict"] == "disagree":
            g, n = r["gymflow"], r["nemo_gym"]
            failure = _short((g.get("details") or {}).get("error") or g.get("failure") or "", 160)
            key = f"gymflow {g.get('reward')} ({g.get('status')}{'; ' + failure if failure else ''})"
            groups.setdefault(key, []).append(f"{r['row']} (NeMo Gym {_num(n.get('reward'))}, recorded "
                                              f"{_num(r['recorded'])})")
    parts += [f"row {', '.join(v)}: {k}" for k, v in groups.items()]
    off = [f"{r['row']} ({_num(r['nemo_gym']['reward'])} vs {_num(r['recorded'])})" for r in rows
           if r["verdict"] != "not runnable" and not r["nemo_matches_recorded"]]
    if off and not result.get("judge"):
        parts.append(f"NeMo Gym's own verdict differs from the recorded reward on row {', '.join(off)}")
    if result.get("judge") and not parts:
        parts.append(f"fake judge for {', '.join(result['judge'])}")
    return "; ".join(parts).replace("|", "\\|")


def _shipped_rows(server: str) -> int:
    """Lines of the server's example_rollouts.jsonl (a refused server's rows are never read)."""
    path = catalogue.server(server).folder / "data" / "example_rollouts.jsonl"
    return sum(1 for line in path.read_text(errors="replace").splitlines() if line.strip()) if path.exists() else 0


def _first_error(result: dict[str, Any]) -> str:
    for row in result["rows"]:
        n = row["nemo_gym"]
        if "error" in n:
            return f"{n.get('error', '')} {n.get('log', '')}"
    return ""


def reason(result: dict[str, Any]) -> str:
    """The class of why a server is not runnable here: REASONS, else read off the refusal or NeMo Gym's error."""
    if result["server"] in REASONS:
        return REASONS[result["server"]]
    text = f"{result.get('not_runnable') or ''} {_first_error(result)}"
    agents = result.get("agents") or []
    found = []  # (where in the text, label): the reason named first is the one given
    for key, label in (("sandbox provider", "needs a sandbox provider"),
                       ("URL or path", "needs packages from git or a URL"),
                       ("not installed", "needs packages not installed here"),
                       ("No module named", "needs packages not installed here"), ("network", "needs the network"),
                       ("URLError", "needs the network"), ("Name or service not known", "needs the network"),
                       ("uv is required", "needs packages not installed here"),
                       ("data not shipped", "data not shipped"),
                       ("rows gymflow cannot load", "rows gymflow cannot load"),
                       ("another agent's protocol", "another agent's protocol (not seed/verify)"),
                       ("values nobody set", "config values nobody set"),
                       ("no verdict within", "no verdict within the time limit"),
                       ("no answer on /health", "no verdict within the time limit")):
        if key in text:
            found.append((text.index(key), label))
    if found:
        return min(found)[1]
    if "/seed_session HTTP 404" in text and agents and "simple_agent" not in agents:
        return "another agent's protocol (not seed/verify)"
    unmatched = any("match no task" in n for n in result.get("notes") or [])
    if "HTTP 422" in text and "Field required" in text and unmatched:
        return "data not shipped (the rollouts' own tasks)"
    if "HTTP 422" in text:
        return "NeMo Gym's own schema rejects the rollout file"
    return "fails inside NeMo Gym"


def _tally(results: dict[str, dict[str, Any]]) -> tuple[Counter[str], Counter[str]]:
    totals: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    for r in results.values():
        c = Counter(row["verdict"] for row in r["rows"])
        totals.update({f"rows {k}": v for k, v in c.items()})
        if r.get("not_runnable") or not c["agree"] + c["disagree"]:
            totals["servers not runnable"] += 1
            reasons[reason(r)] += 1
        elif c["disagree"]:
            totals["servers with a disagreement"] += 1
        else:
            totals["servers agreeing on every row NeMo Gym verifies"] += 1
            totals["... of them on every row"] += not c["not runnable"]
    return totals, reasons


def render(work: Path, servers: list[str], command: str) -> str:
    results = {n: json.loads(f.read_text()) for n in servers if (f := work / "results" / f"{n}.json").exists()}
    lines = []
    for name in servers:
        r = results.get(name)
        if r is None:
            lines.append(f"| {name} | - | - | - | - | not reached yet |")
            continue
        c = Counter(row["verdict"] for row in r["rows"])
        runnable = not r.get("not_runnable") and c["agree"] + c["disagree"]
        nr = c["not runnable"] if runnable else f"all ({reason(r)})"
        rows = len(r["rows"]) or _shipped_rows(name)
        lines.append(f"| {name} | {rows} | {c['agree']} | {c['disagree']} | {nr} | {_why(r)} |")
    totals, reasons = _tally(results)
    order = ("servers agreeing on every row NeMo Gym verifies", "... of them on every row",
             "servers with a disagreement", "servers not runnable", "rows agree", "rows disagree", "rows not runnable")
    missing = len(servers) - len(results)
    head = [
        "# NeMo Gym's catalogue, measured",
        "",
        "Every NeMo Gym 0.7.0 resources server installed here, its recorded rollouts (`data/example_rollouts.jsonl`)",
        "scored twice: by NeMo Gym's own server code (started as `ng_run` starts it, driven as its simple agent",
        "drives it: `/seed_session` with the row, the recorded tool calls, `/verify` with the row and the recorded",
        "`response`) and by gymflow's full stack (Temporal, Postgres, the three pools; the `nemo_gym` environment",
        "with a recorded model replaying the row's model turns, its tool calls run on the server again, the verify",
        "request built from gymflow's transcript). `agree`/`disagree` compare gymflow's reward with NeMo Gym's own",
        "verdict; `not runnable` counts rows NeMo Gym itself cannot verify here (`all (reason)`: the whole server).",
        f"Servers whose config calls a model get the same fake judge on both sides (every answer `{JUDGE_VERDICT}`),",
        "so their rewards test the plumbing, not the recorded judge's verdicts.",
        "",
        f"- command: `.venv/bin/python -m bench.nemo_gym_catalogue` (bench/nemo_gym_catalogue.py; this file was last "
        f"written by `{command}`; `--servers a,b` reruns some, `--resume` skips those done, results per server under "
        "bench/results/nemo-gym-catalogue/results/)",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; machine: {platform.machine()}, "
        f"{os.cpu_count()} cores, gymflow on Python {platform.python_version()}, NeMo Gym 0.7.0 on its own "
        "Python 3.13 (`.nemo313`) holding nemo-gym, math-verify and the own requirements of "
        f"{len(INSTALLED)} servers (`--install`: {', '.join(INSTALLED)})",
        f"- servers: {len(servers)}" + (f" ({missing} not reached yet)" if missing else "") + "; "
        + "; ".join(f"{k}: {totals[k]}" for k in order),
        "- not runnable, by reason: " + "; ".join(f"{k}: {v}" for k, v in reasons.most_common()),
        "",
        *FINDINGS,
        "",
        "| server | rows | agree | disagree | not runnable | why |",
        "|---|---|---|---|---|---|",
    ]
    return "\n".join(head + lines) + "\n"


