"""The unit tests of a code_gen row (LiveCodeBench's stdin/stdout format), and NeMo Gym's `packed` form of them:
parsed with every step bounded, because a dataset row is hostile input."""

from __future__ import annotations

import base64
import binascii
import json
import zlib
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gymflow.kernel.limits import MAX_DECOMPRESSED_BYTES, MAX_UNIT_TEST_BYTES, MAX_UNIT_TESTS


class UnitTests(BaseModel):
    """LiveCodeBench's test format; NeMo Gym may ship it zlib+base64 `packed`."""

    model_config = ConfigDict(frozen=True)

    inputs: tuple[str, ...] = Field(min_length=1, max_length=MAX_UNIT_TESTS)
    outputs: tuple[str, ...] = Field(max_length=MAX_UNIT_TESTS)
    fn_name: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _unpack(cls, value: Any) -> Any:
        if isinstance(value, dict) and "packed" in value:
            decoded = unpack_tests(value["packed"])
            return {"inputs": decoded["inputs"], "outputs": decoded["outputs"], "fn_name": value.get("fn_name")}
        return value

    @model_validator(mode="after")
    def _stdio_pairs(self) -> UnitTests:
        if len(self.inputs) != len(self.outputs):
            raise ValueError(f"{len(self.inputs)} inputs but {len(self.outputs)} outputs")
        for kind, texts in (("inputs", self.inputs), ("outputs", self.outputs)):
            for i, text in enumerate(texts):
                if len(text) > MAX_UNIT_TEST_BYTES // 4 and len(text.encode()) > MAX_UNIT_TEST_BYTES:
                    raise ValueError(f"{kind}[{i}]: over {MAX_UNIT_TEST_BYTES >> 20} MiB")
        if self.fn_name is not None:
            raise ValueError("call-based tests (fn_name) are not supported; only stdin/stdout tests")
        return self


def unpack_tests(packed: Any) -> dict[str, Any]:
    """NeMo Gym's `packed` tests: JSON, zlib-compressed, base64-encoded. A row is hostile input: every step is
    bounded (a 1.4 MB zip bomb once took an env worker to 3.8 GB) and fails as a ValueError, which pydantic
    turns into a `bad_task` naming the field."""
    if not isinstance(packed, str):
        raise ValueError("packed: expected a base64 string")
    try:
        compressed = base64.b64decode("".join(packed.split()), validate=True)  # line breaks are fine, junk not
    except (binascii.Error, ValueError) as e:
        raise ValueError(f"packed: not base64 ({e})") from None
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(compressed, MAX_DECOMPRESSED_BYTES)
    except zlib.error as e:
        raise ValueError(f"packed: not zlib data ({e})") from None
    if not inflater.eof:
        if len(raw) >= MAX_DECOMPRESSED_BYTES:
            raise ValueError(f"packed: decompresses to over {MAX_DECOMPRESSED_BYTES >> 20} MiB")
        raise ValueError("packed: truncated zlib data")
    try:
        decoded = json.loads(raw)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise ValueError(f"packed: not JSON ({str(e)[:200]})") from None
    if not isinstance(decoded, dict) or "inputs" not in decoded or "outputs" not in decoded:
        raise ValueError("packed: expected a JSON object with `inputs` and `outputs`")
    return decoded
