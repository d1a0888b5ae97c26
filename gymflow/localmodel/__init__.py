"""A real local model (SmolLM2-135M-Instruct on CPU via transformers) behind the OpenAI-compatible API, with
vLLM-style token ids and logprobs and weight reloads without restart. See docs/local-model.md.

Importing this package does not import torch; `start_in_thread`/`start_subprocess` need the `local` extra.
"""

from gymflow.localmodel.launch import (
           LocalModelProcess,
           build_engine,
           load_float_model,
           start_in_thread,
           start_subprocess,
)
from gymflow.localmodel.resolve import ModelNotFound, default_gguf

__all__ = ["LocalModelProcess", "load_float_model", "ModelNotFound", "build_engine", "default_gguf", "start_in_thread",
           "start_subprocess"]
