"""Limits on what a dataset may contain, in one place. Each is far above real rows and far below what breaks
the stack: Temporal's payload (2 MB) and id limits, Postgres' text rules, a worker's memory."""

from __future__ import annotations

# A row travels in every rollout's workflow input and in each env activity's input, and Temporal refuses
# a payload over 2 MB. 1 MiB for the row's JSON leaves the model room to answer; NeMo
# Gym's example rows are under 20 kB. A Task spells out fields a row may leave out (a chat row of many
# short messages grows most), so it gets a quarter more: a row meets the row limit first, and only rows
# that balloon meet the Task one.
MAX_ROW_BYTES = 1 << 20
MAX_TASK_BYTES = MAX_ROW_BYTES + (MAX_ROW_BYTES >> 2)

# The workflow id is `<run>/<task>/<sample>` and Temporal caps ids at 1,000 bytes: a task id of at most
# 200 bytes (UTF-8) keeps it well inside with any reasonable run id.
MAX_TASK_ID_BYTES = 200
# The run id heads every workflow id of the run: `<run>/<task>/<sample>` stays far below Temporal's 1,000 bytes.
MAX_RUN_ID_BYTES = 200

# Nesting beyond this is not data anyone means to send; bounding it keeps every recursive walk (ours,
# pydantic's, the JSON encoders') far from Python's recursion limit.
MAX_JSON_DEPTH = 64

# A dataset of garbage (a binary file, the wrong file) must not turn into a million error lines, nor into
# a multi-megabyte `runs.dataset_errors` value: report the first ones and count the rest.
MAX_REPORTED_ERRORS = 1000
MAX_ERROR_CHARS = 500  # one error's text; values quoted in it are cut to fit

# code_gen ships test cases zlib-compressed: bound what one row may expand to (a zip bomb of 1 MB can
# expand to 1 GB), and the tests inside it.
MAX_DECOMPRESSED_BYTES = 64 << 20
MAX_UNIT_TESTS = 10_000
MAX_UNIT_TEST_BYTES = 16 << 20  # one test's input or expected output

# An image in a prompt is a data: URL (nothing is fetched at run time), so it travels inside its row and the
# row's limit bounds it. Named apart so that a message built elsewhere (an environment's prompt) meets the same
# bound, and the error says which limit it met.
MAX_IMAGE_URL_CHARS = MAX_ROW_BYTES
