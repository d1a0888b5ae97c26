"""Moving a trainer's weights into the local model server without the slow part of `save_pretrained`.

Measured on 2 cores with SmolLM2-135M in float32 (bench/weight_sync.py, docs/training.md): `save_pretrained`
takes ~0.55 s of the ~0.7 s a save + `/v1/load_weights` costs, while writing the same tensors with safetensors'
`save_file` takes ~0.15 s; the server's `from_pretrained` of the result takes ~0.06 s. `/dev/shm` is no faster
than the page cache, so the weights root can stay on disk. `save_weights` writes a directory that
`from_pretrained` (and so `/v1/load_weights`) reads like a `save_pretrained` one.

A trainer that runs the server in its own process (`start_in_thread`) skips the file: `state_module` builds the
new module from tensors in memory and the server swaps it in (`LocalModelServer.load_state`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

WEIGHTS_FILE = "model.safetensors"


def _owners(state: Mapping[str, Any]) -> dict[str, Any]:
    """`state` without the entries that share an earlier one's storage (a tied output head)."""
    seen: set[int] = set()
    out: dict[str, Any] = {}
    for name, tensor in state.items():
        if tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            out[name] = tensor
    return out


def unique_tensors(model: Any) -> dict[str, Any]:
    """The state dict without the copies of tied weights (the output head shares the embedding's storage);
    `from_pretrained` ties them again from the config."""
    return {name: t.detach().contiguous() for name, t in _owners(model.state_dict()).items()}


def save_weights(model: Any, directory: str | Path) -> Path:
    """Write `model` (a transformers PreTrainedModel) to `directory` as config.json + model.safetensors, atomically:
    the directory appears complete or not at all, so a server never reads half a checkpoint."""
    from safetensors.torch import save_file

    target = Path(directory)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        model.config.save_pretrained(staging)
        generation = getattr(model, "generation_config", None)
        if generation is not None:
            generation.save_pretrained(staging)
        save_file(unique_tensors(model), staging / WEIGHTS_FILE, metadata={"format": "pt"})
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def state_module(template: Any, state: Mapping[str, Any]) -> Any:
    """A new module shaped like `template` holding copies of `state`'s tensors (the trainer goes on changing its
    own), built without initialising weights; a state that does not fit the architecture raises ValueError."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        fresh = AutoModelForCausalLM.from_config(template.config, dtype=template.dtype)
    copies = {k: v.detach().clone() for k, v in state.items()}
    try:
        fresh.load_state_dict(copies, strict=False, assign=True)
    except RuntimeError as e:  # shapes that do not fit
        raise ValueError(f"the state does not fit the served model: {str(e)[:300]}") from None
    fresh.tie_weights()
    served = dict(template.named_buffers())
    for name, buffer in list(fresh.named_buffers()):  # non-persistent ones (rotary tables) are in no state dict
        if buffer.is_meta and name in served:
            owner, _, attr = name.rpartition(".")
            fresh.get_submodule(owner).register_buffer(attr, served[name].clone(), persistent=False)
    missing = [n for n, p in [*fresh.named_parameters(), *fresh.named_buffers()] if p.is_meta]
    if missing:
        raise ValueError(f"the state lacks {len(missing)} of the served model's tensors, e.g. {missing[:3]}")
    fresh.generation_config = template.generation_config
    return fresh.eval()


def fill_module(module: Any, state: Mapping[str, Any]) -> None:
    """Copy `state`'s tensors into `module`'s own (no new memory: ~10x faster than building a module); a state
    that lacks one of the module's tensors or does not fit raises ValueError."""
    import torch

    own = module.state_dict()
    missing = sorted(set(_owners(own)) - set(state))
    if missing:
        raise ValueError(f"the state lacks {len(missing)} of the served model's tensors, e.g. {missing[:3]}")
    with torch.no_grad():
        for name, tensor in state.items():
            target = own.get(name)
            if target is None or target.shape != tensor.shape:
                shape = None if target is None else tuple(target.shape)
                raise ValueError(f"the state's {name!r} {tuple(tensor.shape)} does not fit the served model "
                                 f"({shape})")
            target.copy_(tensor)
