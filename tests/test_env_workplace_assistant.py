"""The workplace_assistant environment: its 27 tools against NeMo Gym's recorded behaviour, small
episode state, and verification by comparing world states."""

from __future__ import annotations

import csv
import json
import re
import time

import pytest
from gymflow.environments.base import VerifyContext
from gymflow.environments.registry import get_environment
from gymflow.environments.workplace_assistant import WorkplaceAssistantEnvironment
from gymflow.environments.workplace_assistant.common import contains
from gymflow.environments.workplace_assistant.dispatch import replay
from gymflow.environments.workplace_assistant.world import DEFAULT_DIRECTORY, ENV_VAR, pristine

from gymflow.data.datasets import load_jsonl, row_to_task
from gymflow.kernel.errors import ConfigError, ToolError
from tests.conftest import SHARED
from tests.workplace_gold import GOLD_FOR_ROLLOUTS

DATA = SHARED / "workplace_assistant"
ENV = WorkplaceAssistantEnvironment()
CTX = VerifyContext(policy_model="test")



def _task(env_row: dict, gold: list | None = None):
    row = dict(env_row)
    if gold is not None:
        row["ground_truth"] = [{"name": n, "arguments": json.dumps(a)} for n, a in gold]
    return row_to_task(row, env="workplace_assistant", default_id="t")


def _data(gold: list):
    return ENV.parse_task(_task({"responses_create_params": {"input": "hi"}}, gold))


async def _run(calls: list, state: dict | None = None) -> tuple[list, dict]:
    """Run calls in order; returns the decoded outputs (or the ToolError text) and the final state."""
    state = state if state is not None else ENV.setup(None, None)
    outs = []
    for name, args in calls:
        try:
            out = await ENV.call_tool(None, state, name, args)
        except ToolError as e:
            outs.append(f"ToolError: {e}")
            continue
        state = out.state
        outs.append(json.loads(out.content)["output"])
    return outs, state


def test_registered_and_directory_matches_the_world():
    assert isinstance(get_environment("workplace_assistant"), WorkplaceAssistantEnvironment)
    assert len(ENV.tools(_task({"responses_create_params": {"input": "hi"}}), None)) == 27
    seen = set()
    for f in (DATA / "world").glob("*.csv"):
        for row in csv.DictReader(f.open(newline="")):
            seen.update(re.findall(r"[\w.]+@atlas\.com", " ".join(v or "" for v in row.values())))
    assert set(DEFAULT_DIRECTORY) == seen


async def test_directory_and_email_tools():
    outs, state = await _run([
        ("company_directory_find_email_address", {"name": "Carlos"}),
        ("email_search_emails", {"query": "carlos Develop prototype report generation", "page_size": 2}),
        ("email_get_email_information_by_id", {"email_id": "00000057", "field": "subject"}),
        ("email_send_email", {"recipient": "Raj.Patel@atlas.com", "subject": "Hi", "body": "Body"}),
        ("email_reply_email", {"email_id": "00000057", "body": "Thanks"}),
        ("email_forward_email", {"email_id": "00000057", "recipient": "raj.patel@atlas.com"}),
        ("email_delete_email", {"email_id": "00000001"}),
        ("email_search_emails", {"query": "raj.patel", "date_min": "2023-11-30"}),
        ("email_get_email_information_by_id", {"email_id": "501", "field": "subject"}),
    ])
    assert outs[0] == ["carlos.rodriguez@atlas.com"]
    assert outs[1]["emails"][0]["email_id"] == "00000057" and outs[1]["pagination"]["page_size"] == 2
    assert outs[2] == {"subject": "Task Update on Develop prototype for report generation"}
    assert outs[3:7] == ["Email sent successfully.", "Email replied successfully.", "Email forwarded successfully.",
                         "Email deleted successfully."]
    # New mail is dated "now" and gets NeMo Gym's unpadded max + 1 ids: 500 (send), 501 (reply), 502 (forward).
    sent = {e["email_id"]: e for e in outs[7]["emails"] if e["inbox/outbox"] == "outbox"}
    assert set(sent) == {"500", "502"} and sent["500"]["sender/recipient"] == "raj.patel@atlas.com"
    assert sent["502"]["subject"] == "FW: " + outs[2]["subject"]
    assert outs[8] == {"subject": "RE: " + outs[2]["subject"]}
    assert [c[0] for c in state["calls"]] == ["email_send_email", "email_reply_email", "email_forward_email",
                                              "email_delete_email"]


async def test_calendar_tools():
    outs, state = await _run([
        ("calendar_search_events", {"time_min": "2023-12-01 00:00:00", "time_max": "2023-12-01 23:59:59"}),
        ("calendar_get_event_information_by_id", {"event_id": "00000252", "field": "event_name"}),
        ("calendar_create_event", {"event_name": "Sync", "participant_email": "Amir.Ali@atlas.com",
                                   "event_start": "2023-12-04 10:00:00", "duration": "30"}),
        ("calendar_update_event", {"event_id": "00000300", "field": "duration", "new_value": "45"}),
        ("calendar_search_events", {"query": "SYNC", "time_min": "2023-12-04 00:00:00",
                                    "time_max": "2023-12-04 23:59:59"}),
        ("calendar_delete_event", {"event_id": "00000300"}),
    ])
    assert outs[0]["events"][0]["event_id"] == "00000252"  # the day's last event, as example 1 expects
    assert outs[1] == {"event_name": "brainstorming session"}
    assert outs[2] == "00000300" and outs[3] == "Event updated successfully."
    assert outs[4]["events"][0] == {"event_id": "00000300", "event_name": "Sync", "participant_email":
                                    "amir.ali@atlas.com", "event_start": "2023-12-04 10:00:00", "duration": "45"}
    assert outs[5] == "Event deleted successfully." and len(state["calls"]) == 3


async def test_analytics_tools():
    outs, state = await _run([
        ("analytics_get_visitor_information_by_id", {"visitor_id": "0860"}),
        ("analytics_total_visits_count", {"time_min": "2023-11-01", "time_max": "2023-11-03"}),
        ("analytics_engaged_users_count", {"time_min": "2023-11-01", "time_max": "2023-11-03"}),
        ("analytics_traffic_source_count", {"time_min": "2023-11-01", "time_max": "2023-11-03",
                                            "traffic_source": "direct"}),
        ("analytics_get_average_session_duration", {"time_min": "2023-11-01", "time_max": "2023-11-03"}),
        ("analytics_create_plot", {"time_min": "2023-11-01", "time_max": "2023-11-03",
                                   "value_to_plot": "user_engaged", "plot_type": "line"}),
    ])
    assert outs[0][0]["visitor_id"] == "0860" and isinstance(outs[0][0]["user_engaged"], bool)
    assert list(outs[1]) == sorted(outs[1]) and set(outs[1]) <= {"2023-11-01", "2023-11-02", "2023-11-03"}
    for day, total in outs[1].items():
        assert 0 <= outs[2][day] <= total and 0 <= outs[3][day] <= total and isinstance(outs[4][day], float)
    assert outs[5] == "plots/2023-11-01_2023-11-03_user_engaged_line.png"
    assert state["calls"] == [["analytics_create_plot", {"time_min": "2023-11-01", "time_max": "2023-11-03",
                                                         "value_to_plot": "user_engaged", "plot_type": "line"}]]


async def test_project_management_tools():
    outs, state = await _run([
        ("project_management_search_tasks", {"assigned_to_email": "LEILA.AZIZI@atlas.com", "board": "front"}),
        ("project_management_get_task_information_by_id", {"task_id": "00000149", "field": "list_name"}),
        ("project_management_create_task", {"task_name": "Fix login bug", "assigned_to_email": "aisha.chen@atlas.com",
                                            "list_name": "Backlog", "due_date": "2023-12-08", "board": "Back end"}),
        ("project_management_update_task", {"task_id": "00000300", "field": "list_name", "new_value": "In Review"}),
        ("project_management_delete_task", {"task_id": "00000149"}),
    ])
    assert outs[0] and all(t["assigned_to_email"] == "leila.azizi@atlas.com" and t["board"] == "Front end"
                           for t in outs[0])
    assert outs[1] == {"list_name": "Backlog"}
    assert outs[2:] == ["00000300", "Task updated successfully.", "Task deleted successfully."]
    world = replay(state["calls"])
    assert world.find("tasks", "task_id", "00000300")["list_name"] == "In Review"
    assert world.find("tasks", "task_id", "00000149") is None


async def test_crm_tools():
    outs, state = await _run([
        ("customer_relationship_manager_search_customers", {"assigned_to_email": "akira", "status": "lead",
                                                            "product_interest": "software", "page_size": 10}),
        ("customer_relationship_manager_update_customer", {"customer_id": "00000095", "field": "assigned_to_email",
                                                           "new_value": "Raj.Patel@atlas.com"}),
        ("customer_relationship_manager_add_customer", {"customer_name": "Acme", "status": "Lead",
                                                        "assigned_to_email": "raj.patel@atlas.com",
                                                        "customer_email": "INFO@acme"}),
        ("customer_relationship_manager_delete_customer", {"customer_id": "00000009"}),
        ("customer_relationship_manager_search_customers", {"customer_name": "acme"}),
    ])
    assert {c["customer_id"] for c in outs[0]["customers"]} == {"00000095", "00000080", "00000035"}  # example 2
    assert outs[1:4] == ["Customer updated successfully.", "00000200", "Customer deleted successfully."]
    acme = outs[4]["customers"][0]
    assert acme["customer_email"] == "info@acme" and acme["notes"] == "" and acme["customer_phone"] is None
    assert len(state["calls"]) == 3


async def test_bad_arguments_are_tool_errors_with_nemo_gym_messages():
    state = {"calls": [["email_delete_email", {"email_id": "00000001"}]]}
    cases = [
        (("email_delete_email", {"email_id": "00000001"}), "Email not found."),  # already deleted in state
        (("calendar_delete_event", {"event_id": "252"}), "Invalid event ID format. Expected 8-digit ID."),
        (("customer_relationship_manager_update_customer", {"customer_id": "00000001", "field": "status",
                                                            "new_value": "won"}),
         "Status not valid. Please choose from: 'Qualified', 'Won', 'Lost', 'Lead', 'Proposal'"),
        (("project_management_create_task", {"task_name": "x", "assigned_to_email": "nobody@atlas.com",
                                             "list_name": "Backlog", "due_date": "2023-12-01", "board": "Design"}),
         "Assignee email not valid. Please choose from the list of team members."),
        (("customer_relationship_manager_search_customers", {}),
         "No search parameters provided. Please provide at least one parameter."),
        (("email_send_email", {"recipient": "raj", "subject": "s", "body": "b", "cc": "x"}),
         "Error executing tool 'email_send_email': EmailTool.send_email() got an unexpected keyword argument 'cc'"),
        (("calendar_create_event", {"event_name": "x", "participant_email": "a@b.c", "event_start": "soon",
                                    "duration": "30"}), "Invalid event_start format. Expected YYYY-MM-DD HH:MM:SS."),
        (("email_search_emails", {"query": 7}), "Error searching emails: 'int' object has no attribute 'lower'"),
    ]
    for (name, args), message in cases:
        with pytest.raises(ToolError) as err:
            await ENV.call_tool(None, state, name, args)
        assert str(err.value) == message
    with pytest.raises(ToolError, match="unknown tool"):
        await ENV.call_tool(None, state, "email_undo", {})


async def test_state_stays_small_and_the_pristine_world_untouched():
    calls = [("customer_relationship_manager_update_customer",
              {"customer_id": f"{i:08d}", "field": "status", "new_value": "Lost"}) for i in range(10)]
    calls += [("email_send_email", {"recipient": "raj.patel@atlas.com", "subject": f"s{i}", "body": "b" * 200})
              for i in range(5)]
    _, state = await _run(calls + [("email_search_emails", {"query": "kofi"})] * 5)
    assert len(state["calls"]) == 15 and len(json.dumps(state)) < 10_000
    # Replays change forks only: the shared world still has the seed values.
    assert replay(state["calls"]).find("crm", "customer_id", "00000001")["status"] == "Lost"
    assert pristine().find("crm", "customer_id", "00000001")["status"] == "Qualified"
    assert len(pristine().tables["emails"]) == 500


async def test_all_example_ground_truths_validate():
    tasks, errors = load_jsonl(DATA / "example.jsonl", env="workplace_assistant")
    assert not errors and len(tasks) == 5
    for task in tasks:
        score = await ENV.validate(task)
        assert score.reward == 1.0 and not score.details["gold_call_errors"], task.id


async def test_wrong_calls_score_zero():
    tasks, _ = load_jsonl(DATA / "example.jsonl", env="workplace_assistant")
    data = ENV.parse_task(tasks[2])  # reassign Akira's three software leads to Raj
    gold = [(c.name, json.loads(c.arguments)) for c in data.ground_truth]
    wrong = {
        "missing one": gold[:2],
        "extra change": gold + [("customer_relationship_manager_delete_customer", {"customer_id": "00000001"})],
        "wrong assignee": [(n, {**a, "new_value": "lena.schmidt@atlas.com"}) for n, a in gold],
        "nothing": [],
    }
    for why, calls in wrong.items():
        _, state = await _run(calls)
        assert (await ENV.verify(data, (), state, CTX)).reward == 0.0, why
    _, state = await _run(list(reversed(gold)) + [("customer_relationship_manager_search_customers",
                                                   {"status": "Won"})])
    assert (await ENV.verify(data, (), state, CTX)).reward == 1.0  # order and reads do not matter


async def test_verify_semantics_case_and_generated_ids():
    reply = ("email_reply_email", {"email_id": "00000155", "body": "THANK YOU"})
    _, state = await _run([("email_reply_email", {"email_id": "00000155", "body": "thank you"})])
    assert (await ENV.verify(_data([reply]), (), state, CTX)).reward == 1.0  # text is case-insensitive
    status = ("customer_relationship_manager_update_customer", {"customer_id": "00000015", "field": "status",
                                                                "new_value": "Proposal"})
    _, state = await _run([status])
    assert (await ENV.verify(_data([status]), (), state, CTX)).reward == 1.0
    state = {"calls": [[status[0], {**status[1], "new_value": "proposal"}]]}  # status case matters
    assert (await ENV.verify(_data([status]), (), state, CTX)).reward == 0.0
    a, b = [("calendar_create_event", {"event_name": n, "participant_email": "amir.ali@atlas.com",
                                       "event_start": "2023-12-01 09:00:00", "duration": "30"}) for n in "AB"]
    _, state = await _run([b, a])  # created in the other order: their ids swap, which does not matter
    assert (await ENV.verify(_data([a, b]), (), state, CTX)).reward == 1.0


async def test_rollout_parity_with_nemo_gym():
    """Replay each recorded rollout's calls through call_tool: same outputs, same reward."""
    rows = [json.loads(line) for line in (DATA / "example_rollouts.jsonl").read_text().splitlines() if line]
    assert len(rows) == len(GOLD_FOR_ROLLOUTS) == 5
    for i, (row, gold) in enumerate(zip(rows, GOLD_FOR_ROLLOUTS, strict=True)):
        task = _task({k: v for k, v in row.items() if k != "response"}, gold)
        data = ENV.parse_task(task)
        state = ENV.setup(task, data)
        items = row["response"]["output"]
        recorded = {o["call_id"]: o["output"] for o in items if o["type"] == "function_call_output"}
        for item in (o for o in items if o["type"] == "function_call"):
            out = await ENV.call_tool(data, state, item["name"], json.loads(item["arguments"]))
            assert out.content == recorded[item["call_id"]], (i, item["name"])  # byte for byte
            state = out.state
        score = await ENV.verify(data, task.messages, state, CTX)
        assert score.reward == row["reward"], i


def test_data_dir_comes_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    with pytest.raises(ConfigError, match=ENV_VAR):
        pristine()
    monkeypatch.setenv(ENV_VAR, str(DATA))
    assert len(pristine().tables["calendar"]) == 300


def test_model_written_patterns_run_in_linear_time():
    # `(.*)*(.*)*Q` held a worker's loop for hours under Python's `re`; RE2 answers at once.
    started = time.monotonic()
    assert not any(contains("(.*)*(.*)*Q", "a" * 40 + "@atlas.com") for _ in range(20))
    assert time.monotonic() - started < 0.5
    assert contains("ALICE", "alice@atlas.com") and contains(r"^\w+\.\w+@", "alice.smith@atlas.com")
    with pytest.raises(ToolError, match="invalid search pattern"):
        contains(r"(a)\1", "aa")  # a backreference: RE2 cannot, the model is told
    with pytest.raises(TypeError, match="first argument must be string"):
        contains(5, "a")  # as Python's `re` says it (NeMo Gym shows the model that text)
