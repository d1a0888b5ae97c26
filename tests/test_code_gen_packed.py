"""code_gen's compressed (`packed`) test data is hostile input: every way it can be wrong is a `bad_task` that
names the field, and no row can make the env worker decompress without bound (a zip bomb once took it to 3.8 GB).
"""

from __future__ import annotations

import base64
import json
import tracemalloc
import zlib

import pytest
from gymflow.environments.code_gen import CodeGenEnvironment
from gymflow.environments.code_gen_testcases import unpack_tests

from gymflow.kernel.errors import BAD_TASK, TaskError
from gymflow.kernel.limits import MAX_DECOMPRESSED_BYTES, MAX_UNIT_TEST_BYTES, MAX_UNIT_TESTS
from gymflow.kernel.wire import ChatMessage, Task


def pack(payload: bytes) -> str:
    return base64.b64encode(zlib.compress(payload)).decode()


def pack_json(obj: object) -> str:
    return pack(json.dumps(obj).encode())


def parse(unit_tests: dict) -> None:
    task = Task(id="t", env="code_gen", messages=(ChatMessage(role="user", content="q"),),
                data={"verifier_metadata": {"unit_tests": unit_tests}})
    CodeGenEnvironment().parse_task(task)


def bomb(expanded: int) -> str:
    """Zeros compress ~1000:1; build it in chunks so the test itself stays small."""
    z, chunk = zlib.compressobj(9), b"0" * (1 << 20)
    parts = [z.compress(b'{"inputs": ["')] + [z.compress(chunk) for _ in range(expanded >> 20)]
    parts.append(z.compress(b'"], "outputs": ["1"]}') + z.flush())
    return base64.b64encode(b"".join(parts)).decode()


def test_packed_tests_unpack():
    tests = {"inputs": ["1 2\n"], "outputs": ["3\n"]}
    assert unpack_tests(pack_json(tests)) == tests
    wrapped = "\n".join(pack_json(tests)[i:i + 8] for i in range(0, len(pack_json(tests)), 8))
    assert unpack_tests(wrapped) == tests  # base64 broken into lines is still base64
    parse({"packed": pack_json(tests)})


@pytest.mark.parametrize(("packed", "message"), [
    ("!!!!", "packed: not base64"),
    ("abc", "packed: not base64"),
    (5, "packed: expected a base64 string"),
    (base64.b64encode(b"hello world").decode(), "packed: not zlib data"),
    (base64.b64encode(zlib.compress(b'{"inputs": ["1"], "outputs": ["1"]}')[:-6]).decode(),
     "packed: truncated zlib data"),
    (pack(b"\xff\xfe not json"), "packed: not JSON"),
    (pack(b"[" * 100_000), "packed: not JSON"),
    (pack_json([1, 2]), "packed: expected a JSON object with `inputs` and `outputs`"),
    (pack_json({"inputs": ["1"]}), "packed: expected a JSON object with `inputs` and `outputs`"),
    (pack_json({"inputs": [1], "outputs": ["1"]}), "unit_tests.inputs.0: Input should be a valid string"),
])
def test_bad_packed_data_is_a_bad_task_naming_the_field(packed, message):
    with pytest.raises(TaskError, match="verifier_metadata.unit_tests") as err:
        parse({"packed": packed})
    assert message in str(err.value) and err.value.failure_type == BAD_TASK


def test_a_zip_bomb_stops_at_the_decompression_limit():
    packed = bomb(6 * MAX_DECOMPRESSED_BYTES)
    assert len(packed) < 2 << 20
    tracemalloc.start()
    try:
        with pytest.raises(TaskError, match=f"packed: decompresses to over {MAX_DECOMPRESSED_BYTES >> 20} MiB"):
            parse({"packed": packed})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * MAX_DECOMPRESSED_BYTES  # the limit, plus zlib's buffer growth; not the bomb's 6x


def test_the_number_and_size_of_tests_are_bounded():
    many = {"inputs": ["1"] * (MAX_UNIT_TESTS + 1), "outputs": ["1"] * (MAX_UNIT_TESTS + 1)}
    with pytest.raises(TaskError, match="unit_tests.inputs: .*at most 10000 items"):
        parse(many)
    with pytest.raises(TaskError, match="unit_tests.inputs: .*at most 10000 items"):
        parse({"packed": pack_json(many)})
    big = {"inputs": ["1"], "outputs": ["x" * (MAX_UNIT_TEST_BYTES + 1)]}
    with pytest.raises(TaskError, match=r"outputs\[0\]: over 16 MiB"):
        parse({"packed": pack_json(big)})
    parse({"inputs": ["é" * (MAX_UNIT_TEST_BYTES // 2)], "outputs": ["1"]})  # at the limit, in bytes: fine
