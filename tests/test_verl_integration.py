"""gymflow.integrations.verl: the agent loop against verl's real classes (AgentLoopBase, AgentLoopOutput, the
registry, and AgentLoopWorker's own padding and batching of the outputs) and the real stack: token ids as the
server sampled them, mask 0 on the environment's tokens, logprobs aligned, gymflow's stored reward, a failed
rollout masked and flagged, a stack that is down a typed error.

verl cannot live in the project venv: its hydra-core needs antlr4 4.9 while math-verify needs 4.13. It is
installed beside it, into a `pip --target` folder, and the agent loop runs in a child process (as in verl, where
it runs in an AgentLoopWorker actor) with that folder first on its path:

    .venv/bin/pip install --target .verl-venv --no-deps -r .ci/verl-requirements.txt    (.ci/run does)

(279 MB, 240 of them ray; torch, transformers and numpy are the project venv's.) Without it the stack tests skip.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from gymflow.workers.local_stack import free_port

from gymflow.integrations.verl import AGENT_NAME, sampling_from_verl, task_of, verl_rows
from gymflow.kernel.wire import ChatMessage, Task
from gymflow.testing.scripted_openai import (
    assistant_token_ids,
    http_error,
    prompt_token_ids,
    token_logprob,
    weather_responder,
)
from tests.helpers import weather_task

ROOT = Path(__file__).resolve().parents[1]
VERL_DIR = Path(os.environ.get("GYMFLOW_VERL_PATH", ROOT / ".verl-venv"))
PROMPT_LEN, RESPONSE_LEN = 256, 256
needs_verl = pytest.mark.skipif(not (VERL_DIR / "verl" / "experimental" / "agent_loop").is_dir(),
                                reason=f"verl is not installed in {VERL_DIR} (the pip --target line in this "
                                       "module's docstring, ~10 s from a warm cache)")


def _task(task_id: str, city: str) -> Task:
    base = weather_task(task_id)
    system = [m for m in base.messages if m.role == "system"]
    return base.model_copy(update={"messages": (*system, ChatMessage(role="user", content=f"Weather in {city}?"))})


def test_rows_carry_the_task_and_sampling_maps():
    tasks = [_task("a", "Oslo"), _task("b", "Lima")]
    rows = verl_rows(tasks)
    assert [r["agent_name"] for r in rows] == [AGENT_NAME] * 2
    assert [r["extra_info"]["index"] for r in rows] == [0, 1]
    assert [task_of(r) for r in rows] == tasks  # the whole task travels, not just the prompt
    assert rows[1]["prompt"][-1] == {"role": "user", "content": "Weather in Lima?"}
    with pytest.raises(ValueError, match="no 'gymflow_task'.*verl_rows"):
        task_of({"extra_info": {"index": 0}})
    s = sampling_from_verl({"temperature": 0.7, "top_p": 1.0, "top_k": -1, "logprobs": True}, 64)
    assert (s.temperature, s.top_p, s.max_tokens) == (0.7, 1.0, 64)


def _responder(body: dict[str, Any]):
    if any("Atlantis" in str(m.get("content")) for m in body.get("messages") or []):
        return http_error(400, "unsupported city")  # model_bad_request: the rollout fails, not retried
    return weather_responder(body)


@pytest.fixture
def tokenized(tokenizing):
    return tokenizing(_responder)


async def _run_child(spec: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    spec_file, out_file = tmp_path / "spec.json", tmp_path / "out.json"
    spec_file.write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(VERL_DIR), str(ROOT)]), "GYMFLOW_STARTUP_WAIT_S": "1",
           "RAY_USAGE_STATS_ENABLED": "0"}
    # Async, so this loop keeps running the workflow and env pools the child's rollouts need.
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "tests.test_verl_integration", str(spec_file),
                                                str(out_file), cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT)
    stdout, _ = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, stdout.decode(errors="replace")[-4000:]
    return json.loads(out_file.read_text())


@needs_verl
async def test_agent_loop_returns_the_served_tokens_through_verls_worker(gf, tokenized, config_file, sql, run_id,
                                                                         tmp_path):
    tasks = [_task("a", "Oslo"), _task("x", "Atlantis")]
    dead = tmp_path / "dead.yaml"
    dead.write_text(yaml.safe_dump({
        "temporal": {"address": f"127.0.0.1:{free_port()}"},
        "database": {"url": f"postgresql+psycopg://gymflow@127.0.0.1:{free_port()}/gymflow"},
        "models": {"vllm": {"base_url": "http://127.0.0.1:9/v1", "model": "m"}}}))
    got = await _run_child({"config": str(config_file), "dead_config": str(dead), "run_id": run_id,
                            "rows": verl_rows(tasks), "copies": 2}, tmp_path)

    assert got["registered"] == {"_target_": "gymflow.integrations.verl.GymflowAgentLoop"}
    assert got["is_agent_loop"] is True
    ok, failed = got["outputs"][:2], got["outputs"][2:]
    assert len({o["extra_fields"]["gymflow_rollout_id"] for o in ok}) == 2  # two copies, two rollouts
    for o in ok:
        rid = o["extra_fields"]["gymflow_rollout_id"]
        assert rid.startswith(f"{run_id}/a/")
        (transcript, reward), = sql("SELECT transcript, reward FROM rollouts WHERE id = %s", rid)
        assert [m["role"] for m in transcript] == ["system", "user", "assistant", "tool", "assistant"]
        # What the server saw and sampled, recomputed from the stored conversation.
        p0, g0 = prompt_token_ids(transcript[:2]), assistant_token_ids(None, transcript[2]["tool_calls"])
        p1, g1 = prompt_token_ids(transcript[:4]), assistant_token_ids(transcript[4]["content"], None)
        tool = p1[len(p0) + len(g0):]
        assert tool  # the tool result's tokens are in the response, masked
        assert o["prompt_ids"] == p0
        assert o["response_ids"] == g0 + tool + g1
        assert o["response_mask"] == [1] * len(g0) + [0] * len(tool) + [1] * len(g1)
        assert o["response_logprobs"] == [token_logprob(t) if m else 0.0
                                          for t, m in zip(o["response_ids"], o["response_mask"], strict=True)]
        assert reward == 1.0 and o["reward_score"] == reward
        assert o["extra_fields"]["gymflow_masked"] is False and o["num_turns"] == 2

    for o in failed:  # the 400 failed the rollout: masked and flagged, never a bare 0
        rid = o["extra_fields"]["gymflow_rollout_id"]
        assert sql("SELECT status, failure_type FROM rollouts WHERE id = %s", rid) == [("failed", "model_bad_request")]
        assert (o["response_mask"], o["reward_score"]) == ([0], 0.0)
        assert o["extra_fields"]["gymflow_masked"] is True
        assert o["extra_fields"]["gymflow_failure_type"] == "model_bad_request"
        assert o["prompt_ids"]  # verl's tokenizer made them: the rollout left none

    # verl's AgentLoopWorker padded and batched the four outputs as it would its own loops'.
    batch = got["batch"]
    for i, o in enumerate(got["outputs"]):
        n = len(o["response_ids"])
        assert batch["responses"][i][:n] == o["response_ids"]
        assert batch["response_mask"][i][:n] == o["response_mask"] and not any(batch["response_mask"][i][n:])
        assert batch["rollout_log_probs"][i][:n] == pytest.approx(o["response_logprobs"])
        assert batch["prompts"][i][PROMPT_LEN - len(o["prompt_ids"]):] == o["prompt_ids"]  # left-padded
        assert batch["rm_scores"][i][n - 1] == o["reward_score"] and sum(batch["rm_scores"][i]) == o["reward_score"]
    assert batch["gymflow_masked"] == [False, False, True, True]

    assert got["stack_down"]["type"] == "StackUnavailable"
    assert "Run the step again" in got["stack_down"]["message"]


# ---- the child: verl's side, run with the verl folder first on sys.path --------------------------------------

def _tokenizer() -> Any:
    """A real transformers tokenizer, built in memory: verl's worker pads with it; ids are the server's."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({"[PAD]": 0, "[UNK]": 1, "<|im_start|>": 2, "<|im_end|>": 3}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", eos_token="<|im_end|>")
    fast.chat_template = ("{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> "
                          "{% endfor %}{% if add_generation_prompt %}<|im_start|> assistant{% endif %}")
    return fast


async def _child(spec: dict[str, Any]) -> dict[str, Any]:
    import hydra
    import numpy as np
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import (
        AgentLoopBase,
        AgentLoopOutput,
        AgentLoopWorker,
        DictConfigWrap,
        ToolListWrap,
        _agent_loop_registry,
    )
    from verl.utils.dataset.rl_dataset import RLHFDataset

    import gymflow.integrations.verl as gv

    cls = gv.GymflowAgentLoop  # the first lookup registers it, as hydra's _target_ lookup would
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"prompt_length": PROMPT_LEN,
                                                                 "response_length": RESPONSE_LEN}}, "data": {}})
    tok = _tokenizer()

    def make(gymflow_config: str) -> Any:
        # What AgentLoopWorker._run_agent_loop does with an agent_loop_config_path entry.
        entry = {"name": AGENT_NAME, "_target_": "gymflow.integrations.verl.GymflowAgentLoop",
                 "gymflow_config": gymflow_config, "model": "vllm", "run_id": spec["run_id"]}
        return hydra.utils.instantiate(config=entry, trainer_config=DictConfigWrap(config=config), server_manager=None,
                                       tokenizer=tok, processor=None, hf_model_type=None, dataset_cls=RLHFDataset,
                                       data_config=DictConfigWrap(config.data), tools=ToolListWrap([]))

    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
    kwargs = [{"raw_prompt": np.array(r["prompt"], dtype=object), "extra_info": r["extra_info"],
               "index": r["extra_info"]["index"], "tools_kwargs": {}, "data_source": r["data_source"],
               "reward_model": r["reward_model"], "uid": f"u{r['extra_info']['index']}"}
              for r in spec["rows"] for _ in range(spec["copies"])]
    loops = [make(spec["config"]) for _ in kwargs]
    outputs: list[AgentLoopOutput] = list(await asyncio.gather(*(lp.run(sampling, **kw)
                                                                  for lp, kw in zip(loops, kwargs, strict=True))))
    assert all(isinstance(o, AgentLoopOutput) for o in outputs)

    # verl's worker turns the outputs into its batch: padding, masks, rm_scores on the last response token.
    worker = AgentLoopWorker.__new__(AgentLoopWorker)
    worker.config, worker.rollout_config = config, config.actor_rollout_ref.rollout
    worker.tokenizer, worker.processor = tok, None
    worker.reward_loop_worker_handles, worker.distillation_enabled, worker.mm_processor_kwargs = None, False, {}
    dumped = [o.model_dump(mode="json") for o in outputs]  # before the worker adds raw_prompt to extra_fields
    internal = [await worker._agent_loop_postprocess(o, False, **kw) for o, kw in zip(outputs, kwargs, strict=True)]
    proto = worker._postprocess(internal)
    batch = {k: proto.batch[k].tolist() for k in ("prompts", "responses", "response_mask", "rollout_log_probs",
                                                  "rm_scores")}
    batch["gymflow_masked"] = [bool(v) for v in proto.non_tensor_batch["gymflow_masked"]]

    try:
        await make(spec["dead_config"]).run(sampling, **kwargs[0])
        down: dict[str, str] = {"type": "none", "message": ""}
    except Exception as e:  # noqa: BLE001 - reported to the parent, which asserts the type
        down = {"type": type(e).__name__, "message": str(e)}
    for client in gv._clients.values():
        await client.close()
    return {"registered": dict(_agent_loop_registry[AGENT_NAME]), "is_agent_loop": issubclass(cls, AgentLoopBase),
            "outputs": dumped, "batch": batch, "stack_down": down}


if __name__ == "__main__":
    spec_path, out_path = sys.argv[1:3]
    result = asyncio.run(_child(json.loads(Path(spec_path).read_text())))
    Path(out_path).write_text(json.dumps(result))
