"""`gymflow data prepare`: rows checked against the environment's task type, errors by line and field."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner, Result

from gymflow.cli.data_cmd import data
from tests.conftest import ROOT, SHARED


def test_prepare_reports_bad_rows_and_writes_good_ones(tmp_path):
    good = (SHARED / "calendar" / "example.jsonl").read_text().splitlines()
    no_state = json.loads(good[1])
    del no_state["exp_cal_state"]
    bad_constraint = json.loads(good[2])
    first_key = next(iter(bad_constraint["exp_cal_state"]))
    bad_constraint["exp_cal_state"][first_key]["constraint"] = "sometime soon"
    src = tmp_path / "cal.jsonl"
    src.write_text("\n".join([good[0], json.dumps(no_state), json.dumps(bad_constraint), "{oops", good[3]]) + "\n")
    out = tmp_path / "out.jsonl"
    proc = subprocess.run([sys.executable, "-m", "gymflow.cli.main", "data", "prepare", str(src), "--env", "calendar",
                           "--out", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=60,
                          env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 1, proc.stderr  # some rows were invalid
    text = proc.stdout
    assert f"{src}:2: exp_cal_state: Field required" in text
    assert f"{src}:3: exp_cal_state" in text and "sometime soon" in text
    assert f"{src}:4: invalid JSON" in text
    assert "rows: 5  valid: 2  invalid: 3" in text
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2 and all(r["env"] == "calendar" and "exp_cal_state" in r for r in rows)
    assert "exp_cal_state" in text and "(prompt messages)" in text


def test_prepare_unknown_environment_is_a_clear_error(tmp_path):
    src = tmp_path / "d.jsonl"
    src.write_text('{"responses_create_params": {"input": "hi"}}\n')
    proc = subprocess.run([sys.executable, "-m", "gymflow.cli.main", "data", "prepare", str(src), "--env", "nope"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert proc.returncode == 1 and "unknown environment 'nope'" in proc.stderr


# ---- hostile input and the files it writes ------------------------------------------------------------


def run_data(*args: str) -> Result:
    """`gymflow data ...` in process; a traceback shows up as `result.exception` (SystemExit is a normal exit)."""
    result = CliRunner().invoke(data, list(args), env={"COLUMNS": "1000"})
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result


def row(task_id: str, text: str = "hi") -> str:
    return json.dumps({"id": task_id, "responses_create_params": {"input": text}})


def test_prepare_never_writes_onto_its_input(tmp_path):
    src = tmp_path / "d.jsonl"
    src.write_text(row("a") + "\n")
    before = src.read_bytes()
    (tmp_path / "link.jsonl").symlink_to(src)
    for out in (src, tmp_path / "link.jsonl", tmp_path / "." / "d.jsonl"):
        result = run_data("prepare", str(src), "--env", "single_tool", "--out", str(out))
        assert result.exit_code == 1 and "is the input file" in result.output
    assert src.read_bytes() == before


def test_prepare_writes_its_output_whole_or_not_at_all(tmp_path, monkeypatch):
    import gymflow.data.prepare as prep

    src, out = tmp_path / "d.jsonl", tmp_path / "out.jsonl"
    src.write_text("\n".join(row(str(i)) for i in range(5)) + "\n")
    out.write_text("previous output\n")
    lines = iter(range(100))

    def crash_midway(value: dict) -> str:
        if next(lines) == 2:
            raise KeyboardInterrupt  # or a kill: nothing after this point runs
        return json.dumps(value) + "\n"

    monkeypatch.setattr(prep, "_line", crash_midway)
    with pytest.raises(KeyboardInterrupt):
        prep.prepare(src, "single_tool", out)
    assert out.read_text() == "previous output\n"  # not truncated, not half-written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.jsonl", "out.jsonl"]  # no temp file left
    monkeypatch.undo()
    report = prep.prepare(src, "single_tool", out)
    assert report.written == 5 and len(out.read_text().splitlines()) == 5
    assert out.stat().st_mode & 0o777 == 0o644


def test_prepare_reports_duplicates_and_hostile_lines(tmp_path):
    src, out = tmp_path / "d.jsonl", tmp_path / "out.jsonl"
    src.write_bytes(b"\n".join([row("a").encode(), row("a").encode(), b'{"id": "x\xff"}', row("z" * 300).encode(),
                                row("n\x00").encode(), row("b").encode()]) + b"\n")
    before = src.read_bytes()
    result = run_data("prepare", str(src), "--env", "single_tool", "--out", str(out))
    assert result.exit_code == 1
    assert f"{src}:2: id: 'a' repeats line 1" in result.output
    assert f"{src}:3: not valid UTF-8" in result.output
    assert f"{src}:4: id: 300 bytes; at most 200" in result.output
    assert f"{src}:5: id: contains a NUL character" in result.output
    assert "rows: 6  valid: 2  invalid: 4" in result.output
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["a", "b"]
    assert src.read_bytes() == before


def test_prepare_markup_in_row_values_is_printed_not_interpreted(tmp_path):
    src = tmp_path / "d.jsonl"
    src.write_text(row("[/x]") + "\n" + json.dumps({"[/y]": 1, "responses_create_params": {"input": "q"}}) + "\n")
    result = run_data("prepare", str(src), "--env", "single_tool", "--out", str(tmp_path / "o.jsonl"))
    assert f"{src}:1: id: '[/x]' must not contain '/'" in result.output and "[/y]" in result.output


def test_prepare_an_output_folder_that_does_not_exist_is_a_clear_error(tmp_path):
    src = tmp_path / "d.jsonl"
    src.write_text(row("a") + "\n")
    result = run_data("prepare", str(src), "--env", "single_tool", "--out", str(tmp_path / "no" / "o.jsonl"))
    assert result.exit_code == 1 and "No such file or directory" in result.output


def test_prepare_survives_an_environment_that_crashes_on_a_row(tmp_path, monkeypatch):
    from gymflow.environments.single_tool import SingleToolEnvironment

    def parse_task(self, task):
        if task.id == "boom":
            raise KeyError("surprise")

    monkeypatch.setattr(SingleToolEnvironment, "parse_task", parse_task)
    src, out = tmp_path / "d.jsonl", tmp_path / "o.jsonl"
    src.write_text(row("boom") + "\n" + row("ok") + "\n")
    result = run_data("prepare", str(src), "--env", "single_tool", "--out", str(out))
    assert f"{src}:1: environment single_tool could not parse the row: KeyError" in result.output
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["ok"]


def test_join_skips_bad_lines_reports_them_and_fails(tmp_path):
    tasks, rollouts, out = tmp_path / "tasks.jsonl", tmp_path / "rollouts.jsonl", tmp_path / "out.jsonl"
    tasks.write_text("\n".join([json.dumps({"responses_create_params": {"input": "q1"}, "gold": 1}), "{bad",
                                json.dumps({"responses_create_params": {}})]) + "\n")
    rollouts.write_bytes(b"\n".join([
        json.dumps({"responses_create_params": {"input": "q1"}, "reward": 1}).encode(),
        b"{not json", b"[1, 2]", json.dumps({"reward": 0}).encode(),
        json.dumps({"responses_create_params": {"input": 5}}).encode(), b"\xff\xfe",
        json.dumps({"responses_create_params": {"input": "q2"}}).encode(),
    ]) + b"\n")
    result = run_data("join", str(rollouts), "--tasks", str(tasks), "--out", str(out))
    assert result.exit_code == 1
    for line, message in [(2, "invalid JSON"), (3, "row: expected a JSON object"),
                          (4, "responses_create_params: required"), (5, "responses_create_params.input: required"),
                          (6, "not valid UTF-8")]:
        assert f"{rollouts}:{line}: {message}" in result.output
    assert f"{tasks}:2: invalid JSON" in result.output and f"{tasks}:3: responses_create_params.input" in result.output
    assert f"{rollouts}:7: no task in {tasks} has this conversation" in result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    # Numbered as NeMo Gym numbers tasks (the task's index in its file; a row with no task after them) and samples.
    assert rows == [{"responses_create_params": {"input": "q1"}, "gold": 1, "reward": 1, "_ng_task_index": 0,
                     "_ng_rollout_index": 0},
                    {"responses_create_params": {"input": "q2"}, "_ng_task_index": 1, "_ng_rollout_index": 0}]


def test_join_never_writes_onto_an_input(tmp_path):
    tasks, rollouts = tmp_path / "tasks.jsonl", tmp_path / "rollouts.jsonl"
    tasks.write_text(json.dumps({"responses_create_params": {"input": "q"}}) + "\n")
    rollouts.write_text(json.dumps({"responses_create_params": {"input": "q"}}) + "\n")
    before = (tasks.read_bytes(), rollouts.read_bytes())
    for out in (tasks, rollouts):
        result = run_data("join", str(rollouts), "--tasks", str(tasks), "--out", str(out))
        assert result.exit_code == 1 and "is the input file" in result.output
    assert (tasks.read_bytes(), rollouts.read_bytes()) == before
