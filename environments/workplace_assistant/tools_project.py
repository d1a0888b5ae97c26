"""Project management tools (NeMo Gym's ProjectManagementTool): the `tasks` table of board cards."""

from __future__ import annotations

import re
from typing import Any

from gymflow.environments.workplace_assistant.common import contains, fail, records
from gymflow.environments.workplace_assistant.registry import tool
from gymflow.environments.workplace_assistant.world import Row, World, delete_record

OWNER = "ProjectManagementTool"
T, ID = "tasks", "task_id"
LISTS = ("Backlog", "In Progress", "In Review", "Completed")
BOARDS = ("Back end", "Front end", "Design")
_EMAIL = re.compile(r"^[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\.[a-zA-Z]{2,}$")
BAD_LIST = "List not valid. Please choose from: 'Backlog', 'In Progress', 'In Review', 'Completed'."
BAD_BOARD = "Board not valid. Please choose from: 'Back end', 'Front end', 'Design'."
BAD_ASSIGNEE = "Assignee email not valid. Please choose from the list of team members."


def _team(w: World) -> set[str]:
    # "Team members" are whoever already has a task: NeMo Gym checks against the table itself.
    return {r["assigned_to_email"].lower() for r in w.tables[T] if isinstance(r["assigned_to_email"], str)}


@tool("project_management_get_task_information_by_id", OWNER)
def get_task_information_by_id(w: World, task_id: Any = None, field: Any = None) -> dict[str, Any]:
    if not task_id:
        fail("Task ID not provided.")
    if not field:
        fail("Field not provided.")
    row = w.find(T, ID, task_id)
    if row is None:
        fail("Task not found.")
    if field not in row:
        fail("Field not found.")
    return {field: row[field]}


@tool("project_management_search_tasks", OWNER)
def search_tasks(w: World, task_name: Any = None, assigned_to_email: Any = None, list_name: Any = None,
                 due_date: Any = None, board: Any = None) -> list[Row]:
    if not any([task_name, assigned_to_email, list_name, due_date, board]):
        fail("No search parameters provided.")
    if assigned_to_email and not _EMAIL.match(assigned_to_email):
        fail("Invalid email format for assigned_to_email.")
    rows = w.tables[T]
    if task_name:
        rows = [r for r in rows if contains(task_name, r["task_name"])]
    if assigned_to_email:  # the one exact (case-insensitive) filter; the others are regex searches
        rows = [r for r in rows if isinstance(r["assigned_to_email"], str)
                and r["assigned_to_email"].lower() == assigned_to_email.lower()]
    for column, pattern in (("list_name", list_name), ("due_date", due_date), ("board", board)):
        if pattern:
            rows = [r for r in rows if contains(pattern, r[column])]
    return records(rows)


@tool("project_management_create_task", OWNER, mutating=True)
def create_task(w: World, task_name: Any = None, assigned_to_email: Any = None, list_name: Any = None,
                due_date: Any = None, board: Any = None) -> str:
    if not all([task_name, assigned_to_email, list_name, due_date, board]):
        fail("Missing task details.")
    assigned_to_email = assigned_to_email.lower()
    if assigned_to_email not in _team(w):
        fail(BAD_ASSIGNEE)
    if list_name not in LISTS:
        fail(BAD_LIST)
    if board not in BOARDS:
        fail(BAD_BOARD)
    task_id = w.next_id(T, ID)
    w.append(T, {"task_id": task_id, "task_name": task_name, "assigned_to_email": assigned_to_email,
                 "list_name": list_name, "due_date": due_date, "board": board})
    return task_id


@tool("project_management_delete_task", OWNER, mutating=True)
def delete_task(w: World, task_id: Any = None) -> str:
    return delete_record(w, T, ID, task_id, "Task")


@tool("project_management_update_task", OWNER, mutating=True)
def update_task(w: World, task_id: Any = None, field: Any = None, new_value: Any = None) -> str:
    if not task_id or not field or not new_value:
        fail("Task ID, field, or new value not provided.")
    if field == "assigned_to_email":
        new_value = new_value.lower()
    if field == "board" and new_value not in BOARDS:
        fail(BAD_BOARD)
    if field == "list_name" and new_value not in LISTS:
        fail(BAD_LIST)
    if field == "assigned_to_email" and new_value not in _team(w):
        fail(BAD_ASSIGNEE)
    if w.find(T, ID, task_id) is None:
        fail("Task not found.")
    if field not in w.columns[T]:
        fail("Field not valid.")
    w.update(T, ID, task_id, field, new_value)
    return "Task updated successfully."
