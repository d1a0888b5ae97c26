"""gymflow.integrations.nemo_rl against the real stack, driven as NeMo RL drives its NeMo Gym actor.

`_nemo_rl_rollout` reproduces NVIDIA-NeMo/RL@7ea279abfbeb698b092856d0dab61e7cf39bc909
`nemo_rl/experience/rollouts.py`: `_prepare_nemo_gym_rows` (sampling and `_rowidx` stamped on each row),
`run_async_nemo_gym_rollout` (`run_rollouts.options(num_returns="streaming").remote(rows, timer_prefix,
deduplicate_multimodal_data)`, `await` on each streamed ref, `_tensorize_nemo_gym_result`), the
`_NemoGymStreamAccumulator` rules (every row index once, in range; groups of `num_generations` rows of one agent
restored to input order) and the columns `_postprocess_single_nemo_gym_group` reads (`total_reward`,
`mask_sample`, token counts). The actor's lifecycle is `spinup_nemo_gym_actor`'s (`_spinup`, `set_tokenizer`).
"""

from __future__ import annotations

import asyncio
import pickle
from collections import defaultdict
from typing import Any

import pytest
from gymflow.workers.local_stack import free_port
from temporalio.client import Client

from gymflow.client import GymflowClient
from gymflow.integrations.loop import LoopThread
from gymflow.integrations.nemo_rl import (
    GymflowNemoGym,
    RolloutDataFailed,
    RowsRefused,
    StackUnavailable,
    resolve_models,
)
from gymflow.kernel.errors import ConfigError
from gymflow.testing.scripted_openai import (
    assistant_token_ids,
    http_error,
    prompt_token_ids,
    text,
    token_logprob,
    weather_responder,
)

torch = pytest.importorskip("torch")
SYSTEM = "You are a helpful personal assistant that aims to be helpful and reduce any pain points the user has."
TOOLS = [{"name": "get_weather", "type": "function", "description": "", "strict": True,
          "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": ""}},
                         "required": ["city"], "additionalProperties": False}}]


def _row(question: str, agent: str = "example_single_tool_call", **extra: Any) -> dict[str, Any]:
    """A NeMo Gym row as NeMo RL's dataset carries it in `extra_env_info`."""
    return {"responses_create_params": {"input": [{"role": "developer", "content": SYSTEM},
                                                  {"role": "user", "content": question}], "tools": TOOLS},
            "agent_ref": {"type": "responses_api_agents", "name": agent}, **extra}


def _responder(body: dict[str, Any]):
    """Calls the tool (reward 1) unless the question says not to (reward 0); 'broken' questions get a 400."""
    question = next(m["content"] for m in body["messages"] if m["role"] == "user")
    if "broken" in question:
        return http_error(400, "bad request for this prompt")
    if "no tool" in question and body["messages"][-1]["role"] == "user":
        return text("I will not check.")
    return weather_responder(body)


@pytest.fixture
def tokenized(tokenizing):
    return tokenizing(_responder)


class _Tokenizer:
    pad_token_id = 0

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", "replace")


class _RemoteMethod:
    """What `actor.run_rollouts` is on a Ray actor handle: `.options(num_returns="streaming").remote(*args)` gives
    an async iterator of refs, each awaited for its value."""

    def __init__(self, method: Any) -> None:
        self.method = method

    def options(self, num_returns: str) -> _RemoteMethod:
        assert num_returns == "streaming"
        return self

    def remote(self, *args: Any) -> Any:
        async def refs():
            async for item in self.method(*args):
                fut = asyncio.get_running_loop().create_future()
                fut.set_result(pickle.loads(pickle.dumps(item)))  # Ray pickles every streamed value
                yield fut
        return refs()


class _Handle:
    def __init__(self, actor: GymflowNemoGym) -> None:
        self.run_rollouts = _RemoteMethod(actor.run_rollouts)


def _spinup(gf: GymflowClient, scripted, run_id: str, **section: Any) -> GymflowNemoGym:
    """spinup_nemo_gym_actor's steps: the NemoGymConfig from env.nemo_gym, _spinup, set_tokenizer."""
    cfg = {"model_name": "scripted-vllm", "base_urls": [scripted.base_url],
           "initial_global_config_dict": {"gymflow": {"run_id": run_id, **section}}}
    actor = GymflowNemoGym(cfg, client=gf, loop=asyncio.get_running_loop())
    actor._spinup()
    actor.set_tokenizer(_Tokenizer())
    return actor


async def _nemo_rl_rollout(actor: GymflowNemoGym, rows: list[dict], num_generations: int,
                           streamed: list[int] | None = None) -> tuple[list[dict], dict[str, Any]]:
    """run_async_nemo_gym_rollout, as far as it talks to the actor: returns the results in input order and the
    batch columns NeMo RL builds from them."""
    for row_index, row in enumerate(rows):  # _prepare_nemo_gym_rows
        params = row["responses_create_params"]
        params["temperature"], params["top_p"] = 1.0, 1.0
        params["max_output_tokens"] = min(params.get("max_output_tokens") or 512, 512)
        row["_rowidx"] = row_index
    received: dict[int, dict] = {}
    groups: dict[int, dict[int, dict]] = defaultdict(dict)
    timing_seen: dict[str, Any] = {}
    async for ref in _Handle(actor).run_rollouts.options(num_returns="streaming").remote(rows, "timing/rollout",
                                                                                        False):
        rowidx, result, timing = await ref
        if timing is not None:
            timing_seen = timing
        for key in ("input_message_log", "message_log"):  # _tensorize_nemo_gym_result
            for m in result[key]:
                m["token_ids"] = torch.as_tensor(m["token_ids"])
        for m in result["message_log"]:
            if m["role"] == "assistant":
                m["generation_logprobs"] = torch.as_tensor(m["generation_logprobs"])
        assert isinstance(rowidx, int) and 0 <= rowidx < len(rows) and rowidx not in received  # the accumulator
        received[rowidx] = result
        if streamed is not None:
            streamed.append(rowidx)
        groups[rowidx // num_generations][rowidx] = result
    assert sorted(received) == list(range(len(rows))), "stream ended before all rows arrived"
    for g in groups:
        assert len({rows[i]["agent_ref"]["name"] for i in groups[g]}) == 1
    results = [received[i] for i in range(len(rows))]
    batch = {"total_reward": torch.tensor([r["full_result"]["reward"] for r in results]),
             "mask_sample": torch.tensor([bool((r["full_result"].get("instance_config") or {}).get("mask_sample"))
                                          for r in results]),
             "length": torch.tensor([len(r["input_message_log"][0]["token_ids"]) for r in results]),
             "timing": timing_seen}
    return results, batch


def _transcript(sql, rollout_id: str) -> list[dict]:
    (transcript,) = sql("SELECT transcript FROM rollouts WHERE id = %s", rollout_id)[0]
    return transcript


async def test_rows_become_groups_with_token_exact_results_in_input_order(gf, tokenized, sql, run_id):
    actor = _spinup(gf, tokenized, run_id)
    questions = ["weather in Oslo?", "weather in Oslo?", "no tool please", "no tool please"]
    rows = [_row(q) for q in questions]
    results, batch = await _nemo_rl_rollout(actor, rows, num_generations=2)

    for row, result in zip(rows, results, strict=True):
        sent = result["full_result"]["responses_create_params"]
        assert sent["input"] == row["responses_create_params"]["input"] and sent["temperature"] == 1.0
        rid = result["full_result"]["gymflow"]["rollout_id"]
        transcript = _transcript(sql, rid)
        assert transcript[1]["content"] == row["responses_create_params"]["input"][1]["content"]
        # The tokens the server saw and generated, recomputed from the stored conversation.
        assistants = [i for i, m in enumerate(transcript) if m["role"] == "assistant"]
        expect: list[tuple[str, list[int]]] = []
        seen = 0
        for i in assistants:
            prompt = prompt_token_ids(transcript[:i])
            gen = assistant_token_ids(transcript[i].get("content"), transcript[i].get("tool_calls"))
            expect += [("user", prompt[seen:]), ("assistant", gen)]
            seen = len(prompt) + len(gen)
        log = result["message_log"]
        assert [(m["role"], m["token_ids"].tolist()) for m in log] == expect
        for m in log[1::2]:
            served = [token_logprob(t) for t in m["token_ids"].tolist()]
            assert m["generation_logprobs"].tolist() == pytest.approx(served)
            assert m["is_invalid_tool_call"] is False
        assert result["input_message_log"][0]["token_ids"].tolist() == expect[0][1]
        (stored,) = sql("SELECT reward FROM rollouts WHERE id = %s", rid)[0]
        assert result["full_result"]["reward"] == stored
    assert batch["total_reward"].tolist() == [1.0, 1.0, 0.0, 0.0]  # the tool was called, then it was not
    assert batch["mask_sample"].tolist() == [False] * 4
    assert set(batch["timing"]) >= {"timing/rollout/await_results", "timing/rollout/postprocess_results_pct"}
    ids = [r["full_result"]["gymflow"]["rollout_id"] for r in results]
    assert len(set(ids)) == 4 and {i.rsplit("/", 1)[1] for i in ids} == {"0", "1"}  # two groups of two
    assert results[0]["full_result"]["response"]["output"][0]["type"] == "function_call"

    # The same (unstamped) rows again, once delivered, are their next epoch: new samples.
    again, _ = await _nemo_rl_rollout(actor, [_row(q) for q in questions[:2]], num_generations=2)
    assert {r["full_result"]["gymflow"]["rollout_id"].rsplit("/", 1)[1] for r in again} == {"2", "3"}


async def test_stamped_rows_are_durable_and_never_run_twice(gf, tokenized, sql, run_id):
    rows = [_row("weather in Lima?", _ng_task_index=7) for _ in range(2)]
    first, _ = await _nemo_rl_rollout(_spinup(gf, tokenized, run_id), rows, num_generations=2)
    requests = len(tokenized.requests)
    # A restarted actor (Ray rebuilds it), given the same stamped rows: the same rollouts, read back.
    second, _ = await _nemo_rl_rollout(_spinup(gf, tokenized, run_id), [_row("weather in Lima?", _ng_task_index=7)
                                                                         for _ in range(2)], num_generations=2)
    assert len(tokenized.requests) == requests
    ids = [r["full_result"]["gymflow"]["rollout_id"] for r in first]
    assert [r["full_result"]["gymflow"]["rollout_id"] for r in second] == ids
    assert ids[0].endswith("/14") and ids[1].endswith("/15")  # epoch = _ng_task_index 7, 2 samples each
    for a, b in zip(first, second, strict=True):
        assert [m["token_ids"].tolist() for m in a["message_log"]] == [m["token_ids"].tolist()
                                                                      for m in b["message_log"]]
    assert sql("SELECT count(*) FROM rollouts WHERE run_id = %s", run_id) == [(2,)]


async def test_a_failed_rollout_carries_its_type_and_the_other_groups_still_stream(gf, tokenized, run_id):
    actor = _spinup(gf, tokenized, run_id, max_retries=0)
    rows = [_row("weather in Rome?"), _row("weather in Rome?"), _row("broken prompt"), _row("broken prompt")]
    streamed: list[int] = []
    with pytest.raises(RolloutDataFailed) as caught:
        await _nemo_rl_rollout(actor, rows, num_generations=2, streamed=streamed)
    err = caught.value
    assert sorted(streamed) == [0, 1]  # the good group reached NeMo RL before the error
    assert [(f.row_index, f.failure_type, f.retryable) for f in err.failed] == [
        (2, "model_bad_request", False), (3, "model_bad_request", False)]
    assert "bad request for this prompt" in err.failed[0].message and "2 of 4 rows failed" in str(err)
    assert not isinstance(err, ConnectionError)  # NeMo RL's classify_rollout_failure: DATA, not redispatched
    again = pickle.loads(pickle.dumps(err))  # it crosses the Ray actor boundary intact
    assert type(again) is RolloutDataFailed and again.failed == err.failed


async def test_rows_for_an_environment_not_installed_are_refused_before_anything_starts(gf, tokenized, sql, run_id):
    actor = _spinup(gf, tokenized, run_id)
    rows = [_row("weather in Oslo?"), _row("prove it", agent="lean4_prover_agent")]
    with pytest.raises(RowsRefused, match=r"row 1: agent_ref 'lean4_prover_agent' names no installed"):
        await _nemo_rl_rollout(actor, rows, num_generations=1)
    assert tokenized.requests == [] and sql("SELECT count(*) FROM rollouts WHERE run_id = %s", run_id) == [(0,)]


def test_a_stack_that_went_down_is_a_retryable_error(settings, scripted):
    with LoopThread() as lt:
        temporal = lt.run(Client.connect(f"127.0.0.1:{free_port()}", lazy=True))
        dead = GymflowClient(temporal, settings, f"postgresql+psycopg://gymflow@127.0.0.1:{free_port()}/gymflow",
                             reconnect_wait_s=0.5)
        cfg = {"model_name": "scripted-vllm", "base_urls": [scripted.base_url]}
        actor = GymflowNemoGym(cfg, client=dead, loop=lt.loop)
        actor._spinup()
        with pytest.raises(StackUnavailable, match="Call again once it is back") as caught:
            asyncio.run(_nemo_rl_rollout(actor, [_row("weather in Oslo?")], num_generations=1))
        assert isinstance(caught.value, ConnectionError)  # NeMo RL's infra bucket: redispatched
        assert actor.groups_used == {}  # the retry uses the same rollout ids
        lt.run(dead.close())
    with pytest.raises(StackUnavailable, match="not running"):
        asyncio.run(_nemo_rl_rollout(actor, [_row("weather in Oslo?")], num_generations=1))


def test_the_base_url_must_be_a_configured_token_exact_model(settings, scripted):
    assert resolve_models(settings, [scripted.base_url + "/"], "scripted-vllm") == ["vllm"]
    with pytest.raises(ConfigError, match=r"no gymflow model serves NeMo RL's base URL http://10.0.0.1:8000/v1.*"
                                          r"\"return_token_ids\": true"):
        resolve_models(settings, ["http://10.0.0.1:8000/v1"], "policy-model")
    with pytest.raises(ConfigError, match=r"models.policy: set return_token_ids: true"):
        resolve_models(settings, [scripted.base_url], "scripted-model", explicit="policy")
    with pytest.raises(ConfigError, match="router replay"):
        GymflowNemoGym({"model_name": "m", "base_urls": [], "require_routed_experts": True})
    with pytest.raises(RuntimeError, match="_spinup"):
        asyncio.run(anext(GymflowNemoGym({"model_name": "m", "base_urls": []}).run_rollouts([_row("x")], "t")))
