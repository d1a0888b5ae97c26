"""TRL's GRPOTrainer on gymflow, on CPU: SmolLM2-135M learns to answer in one word (env `one_word`).

    python examples/trl_grpo.py --steps 3 --groups 4 --samples 4 --out trl_out

TRL drives the loop; gymflow collects. Each step TRL's sampler repeats `--groups` prompts `--samples` times and
calls gymflow's rollout_func (gymflow.integrations.trl), which runs each block as one group of durable rollouts on
the embedded stack (Temporal, Postgres, the worker pools, the local model server: all started here, stopped at the
end) and hands back the server's own token ids, logprobs and the verifier's rewards. Before collecting for step k
it saves TRL's weights, hot-loads them into the model server and declares policy version v<k>: one call. See
docs/training.md ("TRL").

Writes to --out: curve.json (per step: TRL's reward, loss and the policy versions the rollouts came from).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the example's own modules, when run as a script

from grpo_tasks import QUESTIONS, make_task  # noqa: E402
from gymflow.workers.local_stack import free_port  # noqa: E402

from gymflow import GymflowClient, Settings  # noqa: E402
from gymflow.embedded import (  # noqa: E402
    EmbeddedError,
    embedded_pools,
    local_policy,
    start_local_model,
    wait_for_pools,
    with_policy,
)
from gymflow.integrations.loop import LoopThread  # noqa: E402
from gymflow.integrations.trl import GymflowRollout, WeightSync, gymflow_reward  # noqa: E402

MODEL = "policy"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--groups", type=int, default=4, help="prompts per step")
    p.add_argument("--samples", type=int, default=4, help="rollouts per prompt (TRL's num_generations)")
    p.add_argument("--out", default="trl_out", help="output folder (the embedded stack's state goes there too)")
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--max-tokens", type=int, default=16, help="per reply; a one-word answer needs ~3")
    p.add_argument("--threads", type=int, default=2, help="torch threads for the update")
    p.add_argument("--server-threads", type=int, default=1, help="torch threads of the model server")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--run", default=None, help="run id (default: trl-grpo-<time>, so a rerun in the same --out "
                   "collects afresh rather than reading the earlier run's rollouts)")
    args = p.parse_args(argv)
    for name in ("steps", "groups", "max_tokens", "threads", "server_threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.samples < 2:
        p.error("--samples must be at least 2: advantages are relative to the group")
    if args.groups > len(QUESTIONS):
        p.error(f"--groups must be at most {len(QUESTIONS)}")
    args.run = args.run or time.strftime("trl-grpo-%Y%m%d-%H%M%S")
    return args


def base_settings(state: Path) -> Settings:
    """A private embedded stack on free ports (no gymflow.yaml is read: the example owns its whole setup)."""
    return Settings.model_validate({
        "state_dir": str(state), "temporal": {"port": free_port(), "ui_port": free_port()},
        "rollout": {"max_turns": 1}})


def trainer_for(args: argparse.Namespace, rollout: GymflowRollout, out: Path) -> Any:
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from gymflow.localmodel import default_gguf, load_float_model

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    source, gguf = default_gguf()
    config = GRPOConfig(
        output_dir=str(out / "trl"), max_steps=args.steps, learning_rate=args.lr, seed=args.seed,
        per_device_train_batch_size=args.groups * args.samples, num_generations=args.samples,
        gradient_accumulation_steps=1, max_completion_length=args.max_tokens, beta=0.0,  # no reference model
        use_cpu=True, bf16=False, logging_steps=1, report_to=[], save_strategy="no", dataloader_num_workers=0)
    return GRPOTrainer(model=load_float_model(), processing_class=AutoTokenizer.from_pretrained(str(source),
                       gguf_file=gguf), reward_funcs=gymflow_reward, args=config,
                       train_dataset=Dataset.from_list(rollout.dataset_rows()), rollout_func=rollout)


def train(args: argparse.Namespace, settings: Settings, procs: list, server: Any, out: Path) -> list[dict]:
    tasks = [make_task(i) for i in range(len(QUESTIONS))]
    curve: list[dict[str, Any]] = []
    with LoopThread() as lt:  # the gymflow client's loop; TRL calls the rollout_func from this thread
        client = lt.run(GymflowClient.connect(settings, wait_s=120))
        try:
            lt.run(wait_for_pools(settings, procs))
            epochs = -(-args.steps * args.groups // len(tasks))  # TRL's sampler may come round to a task again
            rollout = GymflowRollout(
                client, lt.loop, args.run, tasks, model=MODEL, num_generations=args.samples, epochs=epochs,
                max_staleness=0, stale="cancel_and_restart",  # every group comes from the weights TRL trains now
                weights=WeightSync(server.base_url, server.control_token, out / "weights", prefix=f"{args.run}-v"))
            trainer = trainer_for(args, rollout, out)
            versions: list[list[str]] = []
            original = rollout.__call__

            def traced(prompts: list, trl_trainer: Any) -> dict:
                result = original(prompts, trl_trainer)
                versions.append(sorted({v for vs in result["gymflow_policy_versions"] for v in vs if v}))
                return result

            trainer.rollout_func = traced
            trainer.train()
            logs = [h for h in trainer.state.log_history if "reward" in h]
            for step, (h, seen) in enumerate(zip(logs, versions, strict=False), start=1):
                curve.append({"step": step, "reward": h["reward"], "loss": h.get("loss"),
                              "versions_generated": seen})
                print(f"step {step}: reward {h['reward']:.3f}, loss {h.get('loss')}, generated by "
                      f"{','.join(seen)}", flush=True)
            # The server serves the last trained weights too: declared as the current policy.
            final = rollout.sync_weights(trainer.accelerator.unwrap_model(trainer.model), trainer.state.global_step)
            print(f"current policy of {MODEL!r}: {final.version} (ordinal {final.ordinal})")
        finally:
            lt.run(client.close())
    return curve


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL 1.16
    out = Path(args.out).resolve()
    state = out / "state"
    state.mkdir(parents=True, exist_ok=True)
    for d in (out, state):
        os.chmod(d, 0o755)  # embedded Postgres runs as its own system user when we are root
    started = time.monotonic()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind like Ctrl-C: stack and server stopped
    try:
        (out / "weights").mkdir(mode=0o700, exist_ok=True)  # the only place the server loads weights from
        # The server names its starting weights as the rollout_func declares step 0: `<run>-v0`.
        server = start_local_model(["--threads", str(args.server_threads), "--weights-root", str(out / "weights"),
                                    "--version", f"{args.run}-v0"], state_dir=state)
    except EmbeddedError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        from gymflow.localmodel.resolve import DEFAULT_NAME

        config = state / "config.yaml"
        settings = with_policy(base_settings(state), local_policy(server.base_url, DEFAULT_NAME), config,
                               {"temperature": 1.0, "max_tokens": args.max_tokens})
        with embedded_pools(settings, str(config), headless=True) as (settings, procs, _):
            curve = train(args, settings, procs, server, out)
    finally:
        server.stop()
    elapsed = time.monotonic() - started
    (out / "curve.json").write_text(json.dumps({"args": vars(args), "elapsed_s": round(elapsed, 1),
                                                "steps": curve}, indent=1))
    print(f"done in {elapsed:.0f}s: {out / 'curve.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
