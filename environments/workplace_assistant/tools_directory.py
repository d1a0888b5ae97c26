"""Company directory: one read-only tool over the employee email addresses."""

from __future__ import annotations

from typing import Any

from gymflow.environments.workplace_assistant.common import contains, fail
from gymflow.environments.workplace_assistant.registry import tool
from gymflow.environments.workplace_assistant.world import World


@tool("company_directory_find_email_address", "CompanyDirectoryTool")
def find_email_address(w: World, name: Any = "") -> list[str]:
    if name == "":
        fail("Name not provided.")
    name = name.lower()
    return [a for a in w.directory if contains(name, a)]
