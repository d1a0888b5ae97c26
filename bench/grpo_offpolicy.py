"""On-policy (K = 0) against the off-policy mode of examples/grpo_local.py, same seed, same tasks, one machine.

    python -m bench.grpo_offpolicy --steps 10 --groups 6 --samples 4 --out bench/results/grpo-offpolicy

Runs the example twice, one after the other (never side by side: they would share the CPU): `--off-policy 0
--ppo-epochs 1` (each step's rollouts from the current weights; the collection waits for the update) and
`--off-policy 1 --ppo-epochs E` for each E in --epochs (the next step's rollouts collected during the update, kept
across the weight change under staleness policy `continue`, E clipped epochs against their behaviour logprobs).
Prints, per run, steps per minute, mean reward over the last three steps, clip fraction and discarded work, and
plots reward per step and per wall-clock second (docs/img/grpo_offpolicy.png).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run(name: str, extra: list[str], args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.out).resolve() / name
    cmd = [sys.executable, str(ROOT / "examples" / "grpo_local.py"), "--steps", str(args.steps), "--groups",
           str(args.groups), "--samples", str(args.samples), "--seed", str(args.seed), "--out", str(out),
           "--run", f"bench-{name}", *extra]
    print("+", " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, check=True, timeout=args.timeout)
    return json.loads((out / "curve.json").read_text())


def summary(name: str, curve: dict[str, Any]) -> dict[str, Any]:
    steps = curve["steps"]
    wall = steps[-1]["elapsed_s"]
    last = steps[-3:]
    return {"run": name, "steps": len(steps), "wall_s": round(wall, 1),
            "steps_per_min": round(len(steps) / (wall / 60), 2),
            "reward_first": round(steps[0]["mean_reward"], 3),
            "reward_last3": round(sum(s["mean_reward"] for s in last) / len(last), 3),
            "clip_fraction_mean": round(sum(s["clip_fraction"] for s in steps) / len(steps), 3),
            "stale_steps": sum(1 for s in steps if s["versions_generated"] != [f"v{s['step'] - 1}"]),
            "update_s_mean": round(sum(s["update_s"] for s in steps) / len(steps), 1),
            "waited_for_rollouts_s_mean": round(sum(s["waited_for_rollouts_s"] for s in steps) / len(steps), 1),
            "save_load_s_mean": round(sum(s["save_load_s"] for s in steps) / len(steps), 2)}


def plot(curves: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6), dpi=120)
    for name, curve in curves.items():
        steps = curve["steps"]
        a.plot([s["step"] for s in steps], [s["mean_reward"] for s in steps], marker="o", label=name)
        b.plot([s["elapsed_s"] for s in steps], [s["mean_reward"] for s in steps], marker="o", label=name)
    a.set_xlabel("step")
    b.set_xlabel("wall-clock seconds since the first collection")
    for ax in (a, b):
        ax.set_ylabel("mean reward of the step's rollouts")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.grpo_offpolicy", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--groups", type=int, default=6)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--epochs", default="2", help="PPO epochs of the off-policy runs: one run per value (e.g. 1,2)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "grpo-offpolicy"))
    ap.add_argument("--plot", default=str(ROOT / "docs" / "img" / "grpo_offpolicy.png"))
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    args = ap.parse_args(argv)
    curves = {"K=0 (on-policy, 1 epoch)": run("k0", ["--off-policy", "0", "--ppo-epochs", "1"], args)}
    for epochs in (int(e) for e in args.epochs.split(",")):
        name = f"K=1 (continue, {epochs} epoch{'s' if epochs > 1 else ''})"
        curves[name] = run(f"k1e{epochs}", ["--off-policy", "1", "--ppo-epochs", str(epochs)], args)
    rows = [summary(name, c) for name, c in curves.items()]
    plot(curves, Path(args.plot))
    print(json.dumps(rows, indent=1))
    (Path(args.out) / "summary.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
