"""Time per weight sync into the local model server, by transfer path (SmolLM2-135M, float32, 538 MB).

    python -m bench.weight_sync --syncs 5 --out bench/results/weight-sync

Paths, each timed from "the trainer has new weights" to "the server answers that it serves them":
  save_pretrained+http  model.save_pretrained(dir) then POST /v1/load_weights (the server is a child process)
  save_weights+http     gymflow.localmodel.weights.save_weights(dir) then the same POST
  save_weights+http shm the same with the weights root on /dev/shm (tmpfs: no disk under the page cache)
  in-process            the server on the trainer's threads: LocalModelServer.load_state(model.state_dict())
Before each sync the weights change (a small step on every tensor), so nothing is skipped; after it a one-token
completion must report the new version and its logprob must differ from before. Prints a table (median, min,
max seconds) for docs/training.md.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx


def nudge(model: Any, k: int) -> None:
    import torch

    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.0 + 1e-3 * (1 if k % 2 else -1))


def first_logprob(base_url: str) -> tuple[str, float]:
    body = {"messages": [{"role": "user", "content": "Say one word."}], "max_tokens": 1, "temperature": 0,
            "logprobs": True}
    reply = httpx.post(base_url.rstrip("/") + "/chat/completions", json=body, timeout=120).json()
    return reply["policy_version"], reply["choices"][0]["logprobs"]["content"][0]["logprob"]


def timed(path: str, model: Any, base_url: str, sync: Callable[[str], None], n: int) -> dict[str, Any]:
    times = []
    _, before = first_logprob(base_url)
    for k in range(n + 1):  # the first is a warm-up: first-touch of fresh memory
        nudge(model, k)
        version = f"{path.split('+')[0]}-{k}"
        started = time.perf_counter()
        sync(version)
        took = time.perf_counter() - started
        served, after = first_logprob(base_url)
        if served != version or after == before:
            raise SystemExit(f"{path}: after the sync the server reports {served} (logprob {after} was {before})")
        before = after
        if k:
            times.append(took)
    row = {"path": path, "median_s": statistics.median(times), "min_s": min(times), "max_s": max(times)}
    print(f"{path:24} median {row['median_s']:.3f} s  min {row['min_s']:.3f}  max {row['max_s']:.3f}", flush=True)
    return row


def http_path(name: str, model: Any, root: Path, save: Callable[[Any, Path], Any], n: int) -> dict[str, Any]:
    from gymflow.embedded import start_local_model
    from gymflow.localmodel.control import load_weights

    root.mkdir(parents=True, exist_ok=True)
    server = start_local_model(["--threads", "1", "--weights-root", str(root)], state_dir=root.parent)
    try:
        parts: list[tuple[float, float]] = []

        def sync(version: str) -> None:
            started = time.perf_counter()
            save(model, root / version)
            saved = time.perf_counter() - started
            reply = load_weights(server.base_url, server.control_token, root / version, version, timeout_s=300)
            parts.append((saved, float(reply["load_s"])))
            shutil.rmtree(root / version)  # what a trainer does with the previous version once it is declared

        row = timed(name, model, server.base_url, sync, n)
        row["save_s"] = statistics.median(s for s, _ in parts[1:])
        row["server_load_s"] = statistics.median(ld for _, ld in parts[1:])
        print(f"{'':24} of which save {row['save_s']:.3f} s, server load {row['server_load_s']:.3f} s", flush=True)
        return row
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


def in_process(model: Any, n: int) -> dict[str, Any]:
    from gymflow.localmodel.launch import start_in_thread

    server = start_in_thread()
    try:
        return timed("in-process", model, server.base_url,
                     lambda version: server.load_state(model.state_dict(), version), n)
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--syncs", type=int, default=5, help="timed syncs per path (after one warm-up)")
    p.add_argument("--out", default="bench/results/weight-sync", help="disk folder for the weights root")
    p.add_argument("--threads", type=int, default=1, help="torch threads of the trainer side")
    args = p.parse_args(argv)
    import torch

    from gymflow.localmodel.launch import load_float_model
    from gymflow.localmodel.weights import save_weights

    torch.set_num_threads(args.threads)
    model = load_float_model()
    out = Path(args.out).resolve()
    rows = [http_path("save_pretrained+http", model, out / "disk-a", lambda m, d: m.save_pretrained(d), args.syncs),
            http_path("save_weights+http", model, out / "disk-b", save_weights, args.syncs)]
    if Path("/dev/shm").is_dir():
        shm = Path(tempfile.mkdtemp(prefix="gymflow-weights-", dir="/dev/shm"))
        try:
            rows.append(http_path("save_weights+http shm", model, shm / "root", save_weights, args.syncs))
        finally:
            shutil.rmtree(shm, ignore_errors=True)
    rows.append(in_process(model, args.syncs))
    print("\n| path | median s | min s | max s |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['path']} | {r['median_s']:.3f} | {r['min_s']:.3f} | {r['max_s']:.3f} |")


if __name__ == "__main__":
    main()
