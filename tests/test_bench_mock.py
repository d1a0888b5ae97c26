"""The benchmark mock server (gymflow/testing/mock_openai.py): schema-driven tool calls, determinism, latency,
per-request stats."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from gymflow.testing.mock_openai import MockOpenAI, args_from_schema, is_right, respond

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
BOOK = {"type": "function", "function": {"name": "book", "parameters": {
    "type": "object", "required": ["nights", "when", "kind", "guests", "opts"],
    "properties": {"nights": {"type": "integer", "minimum": 2}, "when": {"type": "string", "format": "date"},
                   "kind": {"type": "string", "enum": ["suite", "room"]}, "guests": {"type": "array",
                   "minItems": 1, "items": {"type": "object", "properties": {"name": {"type": "string"}},
                                            "required": ["name"]}},
                   "opts": {"anyOf": [{"type": "null"}, {"type": "boolean"}]}, "note": {"type": "string"}}}}}


def chat(url: str, body: dict, headers: dict | None = None) -> dict:
    r = httpx.post(f"{url}/chat/completions", json=body, headers=headers, timeout=10)
    r.raise_for_status()
    return r.json()


def test_tool_arguments_follow_the_offered_schema():
    args = args_from_schema(BOOK["function"]["parameters"])
    assert set(args) == {"nights", "when", "kind", "guests", "opts"}  # required only: no `note`
    assert isinstance(args["nights"], int) and args["nights"] >= 2
    assert args["kind"] in ("suite", "room")
    assert isinstance(args["when"], str) and args["when"]
    assert isinstance(args["guests"], list) and len(args["guests"]) == 1 and isinstance(args["guests"][0]["name"], str)
    assert args["opts"] is True
    assert args_from_schema(WEATHER["function"]["parameters"]) == {"city": "SF"}


@pytest.mark.parametrize("schema", [None, 3, "x", [], {"properties": []}, {"type": "object", "properties": {
    "a": {"type": ["null", "integer"]}, "b": {"oneOf": "junk"}, "c": {"$ref": "#/x"}}}])
def test_odd_schemas_give_json_arguments(schema):
    json.dumps(args_from_schema(schema))  # never raises, always serialisable


def test_tool_call_first_then_text_and_math_is_boxed():
    first = {"messages": [{"role": "user", "content": "weather in sf?"}], "tools": [BOOK, WEATHER]}
    reply = respond(first)
    assert reply.tool_calls and reply.tool_calls[0][0] == "book"  # the first offered tool
    assert json.loads(reply.tool_calls[0][1]) == args_from_schema(BOOK["function"]["parameters"])
    after = {**first, "messages": [*first["messages"], {"role": "assistant", "tool_calls": []},
                                   {"role": "tool", "content": "cold", "tool_call_id": "c"}]}
    assert not respond(after).tool_calls and "cold" in (respond(after).content or "")
    math = respond({"messages": [{"role": "user", "content": "Solve: what is 17 + 25? Put it in \\boxed{}."}]})
    assert "\\boxed{" in (math.content or "") and not math.tool_calls
    assert respond({"messages": "junk", "tools": {"x": 1}}).content  # hostile shapes still get an answer


def test_server_is_deterministic_and_records_stats():
    body = {"model": "m", "messages": [{"role": "user", "content": "weather?"}], "tools": [WEATHER]}
    with MockOpenAI() as mock:
        a, b = chat(mock.base_url, body), chat(mock.base_url, body)
        call_a, call_b = a["choices"][0]["message"]["tool_calls"][0], b["choices"][0]["message"]["tool_calls"][0]
        assert call_a["function"] == call_b["function"] == {"name": "get_weather", "arguments": '{"city": "SF"}'}
        chat(mock.base_url, body, headers={"X-Gymflow-Rollout": "run/t/0"})
        bad = httpx.post(f"{mock.base_url}/chat/completions", content=b"\x00not json", timeout=10)
        assert bad.status_code == 400
        stats = httpx.get(f"http://{mock.base_url.split('/')[2]}/stats", params={"reset": 1}, timeout=10).json()
        after = httpx.get(f"http://{mock.base_url.split('/')[2]}/stats", timeout=10).json()
    reqs = stats["requests"]
    assert len(reqs) == 3 and after["requests"] == []
    assert reqs[0]["key"] == reqs[1]["key"] != reqs[2]["key"] == "run/t/0"
    assert all(r["turn"] == 0 and r["tool_call"] and r["sent"] >= r["arrived"] for r in reqs)


def test_latency_is_applied_and_measured():
    body = {"messages": [{"role": "user", "content": "hi"}]}
    with MockOpenAI(latency_s=0.3) as mock:
        t0 = time.monotonic()
        chat(mock.base_url, body)
        took = time.monotonic() - t0
        (rec,) = mock.stats()["requests"]
    assert took >= 0.3 and rec["sent"] - rec["arrived"] >= 0.3
    with pytest.raises(ValueError, match="latency_s"):
        MockOpenAI(latency_s=-1)


def test_bench_splits_conversations_and_caps_curve_n():
    from bench.runs import conversations, curve_n

    recs = [{"arrived": t, "turn": turn} for t, turn in ((3, 0), (1, 0), (2, 1), (4, 1), (5, 0))]
    assert [[r["arrived"] for r in c] for c in conversations(recs)] == [[1, 2], [3, 4], [5]]
    assert curve_n(100, None, 30) == (300, False)
    assert curve_n(100, 5.0, 30) == (150, True)  # 300 at 5/s would take 60 s
    assert curve_n(1000, 5.0, 30) == (1000, True)  # never fewer than the in-flight count


def test_bench_report_and_compare_read_results():
    from bench.report import compare, render

    before = {"meta": {"date": "a"}, "workloads": {"single_tool": {"rollouts_per_s": 10.0}}}
    after = {"meta": {"date": "b"}, "workloads": {"single_tool": {"rollouts_per_s": 50.0}}}
    assert "| single tool rollouts/s | >= 45 | 50.0 | met |" in render(after)
    assert "| single tool rollouts/s | >= 45 | 10.0 | **missed** |" in render(before)
    assert "| `workloads.single_tool.rollouts_per_s` | 10 | 50 | +400% |" in compare(before, after)


def test_side_by_side_table_and_noisy_report():
    from bench.nemo_gym_side_by_side import table
    from bench.noisy_neighbour import DEFAULT_KINDS, hostile_tasks, report

    g = {"system": "gymflow", "pair": 1, "generate": "local", "workflow_procs": 1, "rollouts_per_s": 40.0,
         "cpu_s_per_1000_total": 36.0, "transitions_per_rollout": 3.0, "p50_latency_s": 10.0, "p95_latency_s": 20.0,
         "statuses": {"completed": 1000}, "cpu_s_per_1000": {"temporal": 16.0, "mock": 1.0}}
    ng = {"system": "NeMo Gym 0.7.0", "pair": 1, "rollouts_per_s": 50.0, "cpu_s_per_1000_total": 30.0, "rows": 1000,
          "mean_reward": 1.0, "cpu_s_per_1000": {"ray": 2.0}}
    out = table([g, ng])
    assert "| 1 | gymflow (`placement: local`, 1 workflow-pool process) | 40.0 | 36.0 | 3.0 |" in out
    assert "mock" not in out.split("\n")[2] and "rate 0.80-0.80x" in out and "CPU per rollout 1.20-1.20x" in out

    tasks = hostile_tasks("t", 5.0)
    assert [t.id.rsplit("-", 1)[1] for t in tasks][1:] == ["spin", "allocate", "print", "hang_verify"]
    assert len(tasks) == len(DEFAULT_KINDS) and tasks[0].env == "workplace_assistant"
    brackets = hostile_tasks("t", 5.0, ("brackets",), brackets=3)
    assert [t.env for t in brackets] == ["instruction_following"] * 3 and len({t.id for t in brackets}) == 3
    assert tasks[0].tools[0].parameters["properties"]["name"]["default"] == "(.*)*(.*)*Q"
    assert [t.id for t in hostile_tasks("t", 5.0, ("spin",))] == ["t-hostile-spin"]
    run = {"n_normal": 2, "wall_s": 1.0, "normal_done_s": 1.0, "normal_p50_s": 1.0, "normal_max_s": 2.0,
           "pool_log_bytes": 0, "peak_pss_mib": {"pool workflows": 100}}
    runs = [run | {"pair": 1, "hostile": False, "normal_p95_s": 1.0, "hostile_outcomes": {}},
            run | {"pair": 1, "hostile": True, "normal_p95_s": 1.4, "hostile_outcomes": {"spin": {
                "status": "completed", "failure_type": None, "masked": False, "reward": 1.0, "latency_s": 10.0,
                "tool_message": "Error: tool call exceeded its 10 s limit"}}}]
    text = report(runs)
    assert "1.40x (target <= 1.5x: met)" in text and "| 1 | 2 + 1 hostile |" in text and "exceeded its 10 s" in text


def test_stack_worker_command_installs_first():
    import sys

    from bench.stack import _worker_command

    assert _worker_command(None) == [sys.executable, "-m", "gymflow.cli.main"]
    cmd = _worker_command("bench.hostile_env:install")
    assert cmd[1] == "-c" and cmd[2].startswith("import bench.hostile_env; bench.hostile_env.install(); ")


@pytest.mark.parametrize("workload", ["single_turn", "math", "single_tool"])
def test_mock_is_right_on_exactly_the_seeded_tasks(workload):
    """Issue 20: each row scored by the real verifier, right where `is_right` says and 0 elsewhere."""
    import asyncio

    from gymflow.environments.base import VerifyContext
    from gymflow.environments.registry import get_environment

    from bench.workloads import answers, base_tasks
    from gymflow.kernel.wire import ChatMessage, FunctionCall, ToolCall
    from gymflow.testing.mock_openai import is_right

    table = answers()
    rewards: dict[bool, list[float]] = {True: [], False: []}
    for task in base_tasks(workload):
        env = get_environment(task.env)
        data = env.parse_task(task)
        for right in (True, False):
            body = {"messages": [m.model_dump(exclude_none=True) for m in task.messages],
                    "tools": [{"type": "function", "function": {"name": t.name, "parameters": t.parameters}}
                              for t in env.tools(task, data)]}
            messages = list(task.messages)
            for _ in range(3):
                reply = respond(body, table, right)
                calls = tuple(ToolCall(id=f"c{i}", function=FunctionCall(name=n, arguments=a))
                              for i, (n, a) in enumerate(reply.tool_calls or ()))
                messages.append(ChatMessage(role="assistant", content=reply.content, tool_calls=calls or None))
                body["messages"].append({"role": "assistant", "content": reply.content})
                if not calls:
                    break
                messages.append(ChatMessage(role="tool", content="error", tool_call_id="c0"))
                body["messages"].append({"role": "tool", "content": "error", "tool_call_id": "c0"})
            score = asyncio.run(env.verify(data, messages, {}, VerifyContext("")))
            rewards[right].append(score.reward)
    assert rewards[True] and set(rewards[True]) == {1.0} and set(rewards[False]) == {0.0}
    keys = [f"run/{workload}-{i}" for i in range(2000)]
    share = sum(is_right(k, 0.3, seed=7) for k in keys) / len(keys)
    assert abs(share - 0.3) < 0.05 and [is_right(k, 0.3, 7) for k in keys] == [is_right(k, 0.3, 7) for k in keys]
    assert not any(is_right(k, 0.0) for k in keys) and all(is_right(k, 1.0) for k in keys)


def test_server_uses_the_rollout_task_for_the_choice():
    prompt = "Calculate 5 - 3 - 6."
    body = {"messages": [{"role": "user", "content": prompt}]}
    with MockOpenAI(answers={prompt: "-4"}, correct_fraction=0.5, seed=3) as mock:
        for i in range(20):
            key = f"run/t-{i}"
            got = [chat(mock.base_url, body, headers={"X-Gymflow-Rollout": f"{key}/{s}"})["choices"][0]["message"]
                   ["content"] for s in range(2)]
            assert got[0] == got[1] == ("The answer is \\boxed{-4}." if is_right(key, 0.5, 3)
                                        else "The answer is \\boxed{-3}.")
    with pytest.raises(ValueError, match="correct_fraction"):
        MockOpenAI(correct_fraction=1.5)


def test_bench_fails_loudly_on_a_wrong_mean_reward():
    from bench.workloads import Collected, check_reward

    ids = [f"t-{i}" for i in range(400)]
    pairs = [(t, float(is_right(f"run/{t}", 0.5))) for t in ids]
    got = Collected("run", 400, 1.0, {"completed": 400}, sum(r for _, r in pairs) / 400, [], {}, [], pairs)
    assert check_reward("math", got, 0.5, 0)["expected_mean_reward"] == got.mean_reward
    zero = Collected("run", 400, 1.0, {"completed": 400}, 0.0, [], {}, [], [(t, 0.0) for t in ids])
    with pytest.raises(SystemExit, match=r"workload math: mean reward 0\.0000 over 400 rollouts, expected 0\.4"):
        check_reward("math", zero, 0.5, 0)
