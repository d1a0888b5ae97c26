"""`gymflow data prepare`: rows checked against the environment's task type, errors by line and field."""

from __future__ import annotations

import json
import subprocess
import sys

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
