"""Catch a row sent to the wrong environment, by the verifier fields it carries.

Each environment knows a set of row fields: its task type's fields plus its `row_fields` declaration
(environments/base.py). A row sent to environment T is wrong when another installed environment E knows
more of the row's fields than T does and E's task type accepts the row (an `xlam_fc` row, which has
`expected_answers`, sent to `single_tool`, which knows no fields), or when T rejects the row and some E
accepts it. The error names E and the fields that gave it away.

Cheap on the common path: only T is imported. The other environments are imported (once per process) only
for a row with fields T does not know, or one T rejects. A row whose fields two environments know equally
well (`question` + `expected_answer`: `math_with_judge` and `equivalence_llm_judge`) is told apart only by
NeMo Gym's `agent_ref`, when the row carries one (`agent_environment`).
"""

from __future__ import annotations

from collections.abc import Collection
from functools import cache, lru_cache
from typing import TYPE_CHECKING

from gymflow.kernel.errors import TaskError
from gymflow.kernel.wire import Task

if TYPE_CHECKING:
    from gymflow.environments.base import Environment

# Fields every row may carry whatever its environment: the prompt, routing, and NeMo Gym's rollout
# bookkeeping (a joined replay row keeps them). Fields starting with `_` (`_ng_task_index`) are ignored too.
GENERIC_FIELDS = frozenset({
    "id", "env", "responses_create_params", "agent_ref", "messages", "tools", "max_turns",
    "response", "reward", "agent_timeout_error", "context_length_exceeded_error", "finished_naturally", "turns_used",
})
_SHOWN_FIELDS = 5  # at most this many field names in a message


def row_fields(task: Task) -> frozenset[str]:
    """The row's environment-specific fields."""
    return frozenset(k for k in task.data if k not in GENERIC_FIELDS and not k.startswith("_"))


def is_rollout_row(task: Task) -> bool:
    """A NeMo Gym rollout row: a recorded `response` and its `reward`."""
    response = task.data.get("response")
    return isinstance(response, dict) and "output" in response and "reward" in task.data


@cache
def _environment(name: str) -> Environment | None:
    """The installed environment, or None when it is not installed or will not load (routing only advises)."""
    from gymflow.environments.registry import get_environment

    try:
        return get_environment(name)
    except Exception:
        return None


@cache
def _installed() -> tuple[str, ...]:
    from gymflow.environments.registry import available

    return tuple(available())


@cache
def _known(name: str) -> frozenset[str]:
    env = _environment(name)
    if env is None:
        return frozenset()
    try:
        return type(env).known_fields()
    except Exception:  # a plug-in without a usable task type: it claims no rows
        return frozenset()


def _accepts(name: str, task: Task) -> str | None:
    """None when `name`'s task type accepts the row, else why not."""
    env = _environment(name)
    if env is None:
        return "not installed"
    try:
        env.parse_task(task)
    except TaskError as e:
        return str(e)
    except Exception as e:  # plug-in code: a crash is a refusal, not the file's error
        return f"environment {name} could not parse the row: {type(e).__name__}: {e}"
    return None


@lru_cache(maxsize=1024)  # bounded: hostile rows may each bring a new set of keys
def _rivals(target: str, fields: frozenset[str], target_fits: bool) -> tuple[tuple[str, frozenset[str]], ...]:
    """Other environments that know more of `fields` than `target` (any of them when `target` rejects the row),
    most fields first, each with the fields it knows. Cached per field set: datasets repeat a few shapes."""
    floor = len(fields & _known(target)) if target_fits else 0
    found = [(name, fields & _known(name)) for name in _installed() if name != target]
    better = [(name, shared) for name, shared in found if len(shared) > floor]
    return tuple(sorted(better, key=lambda r: (-len(r[1]), r[0])))


def _names(fields: Collection[str]) -> str:
    shown = sorted(fields)
    more = f" and {len(shown) - _SHOWN_FIELDS} more" if len(shown) > _SHOWN_FIELDS else ""
    return ", ".join(shown[:_SHOWN_FIELDS]) + more


def better_environments(target: str, task: Task, target_error: str | None) -> tuple[list[str], frozenset[str]]:
    """The environments that fit the row better than `target` (several when they know its fields equally well),
    and the row fields the first one knows. ([], {}) when none does."""
    fields = row_fields(task)
    env = _environment(target)
    if target_error is None and (fields <= _known(target) or (env is not None and type(env).accepts_any_row)):
        return [], frozenset()  # everything here is the target's: no other environment is even imported
    names: list[str] = []
    best: frozenset[str] = frozenset()
    for name, shared in _rivals(target, fields, target_error is None):
        if names and len(shared) < len(best):
            break
        if _accepts(name, task) is None:
            names.append(name)
            best = best or shared
    return names, best


# NeMo Gym agent names that do not start with the gymflow environment's name.
_AGENT_ALIASES = {"example_single_tool_call": "single_tool"}


def agent_environment(row: object) -> str | None:
    """The installed environment a NeMo Gym row's `agent_ref` names (`equivalence_llm_judge_simple_agent` ->
    `equivalence_llm_judge`): the longest environment name its agent name starts with. None when it names none.
    The one signal for rows whose fields two environments share (`question` + `expected_answer`)."""
    ref = row.get("agent_ref") if isinstance(row, dict) else None
    name = ref.get("name") if isinstance(ref, dict) else None
    if not isinstance(name, str):
        return None
    candidates = {**{env: env for env in _installed()}, **_AGENT_ALIASES}
    matches = [prefix for prefix in candidates if name == prefix or name.startswith(prefix + "_")]
    return candidates[max(matches, key=len)] if matches else None


def join_hint() -> str:
    return ("it is a NeMo Gym rollout row (it has `response` and `reward`) without its task's fields: run "
            "`gymflow data join ROLLOUTS --tasks TASKS --out OUT` first and use OUT")


def route_problem(target: str, task: Task, *, check_target: bool = True, row: object = None) -> str | None:
    """Why the row should not go to `target`, naming the environment it fits better if any; None when it is fine
    there. `check_target=False` reports only a row that another environment fits better or a raw rollout row
    (the caller lets the rollout itself report a row the target rejects). Nothing is flagged for an environment
    that is not installed."""
    env = _environment(target)
    if env is None:
        return None
    named = agent_environment(row)
    if named is not None and named != target and not type(env).accepts_any_row and _accepts(named, task) is None:
        return (f"its agent_ref names NeMo Gym's `{row['agent_ref']['name'][:80]}` (a `{named}` row), not a "  # type: ignore[index]
                f"`{target}` one; run with --env {named}")
    target_error = _accepts(target, task)
    if is_rollout_row(task) and target_error is not None:
        return f"{target_error}; {join_hint()}"
    names, shared = better_environments(target, task, target_error)
    if names:
        kinds = " or ".join(f"`{n}`" for n in names)
        runs = " or ".join(f"--env {n}" for n in names)
        advice = f"looks like a {kinds} row (has {_names(shared)}), not a `{target}` one; run with {runs}"
        return advice if target_error is None else f"{target_error}; the row {advice}"
    return target_error if check_target else None
