"""Calendar tools (NeMo Gym's CalendarTool): the `calendar` table of one-participant events."""

from __future__ import annotations

from typing import Any

from gymflow.environments.workplace_assistant.common import contains, fail, paginate, parse_ts, records
from gymflow.environments.workplace_assistant.registry import tool
from gymflow.environments.workplace_assistant.world import World, delete_record

OWNER = "CalendarTool"
T, ID = "calendar", "event_id"
READABLE = ("event_id", "event_name", "participant_email", "event_start", "duration")
WRITABLE = READABLE[1:]


def _check_id(event_id: Any) -> None:
    if not (isinstance(event_id, str) and len(event_id) == 8 and event_id.isdigit()):
        fail("Invalid event ID format. Expected 8-digit ID.")


def _check_start(value: Any) -> None:
    try:
        parse_ts(value)
    except ValueError:
        fail("Invalid event_start format. Expected YYYY-MM-DD HH:MM:SS.")


def _check_duration(value: Any) -> None:
    try:
        minutes = int(value)
    except ValueError:
        fail("Invalid duration format. Expected a number of minutes.")
    if minutes <= 0:
        fail("Duration must be a positive number of minutes.")


@tool("calendar_get_event_information_by_id", OWNER)
def get_event_information_by_id(w: World, event_id: Any = None, field: Any = None) -> dict[str, Any]:
    if not event_id:
        fail("Event ID not provided.")
    if not field:
        fail("Field not provided.")
    _check_id(event_id)
    if field not in READABLE:
        fail(f"Invalid field. Available fields are: {', '.join(READABLE)}")
    row = w.find(T, ID, event_id)
    if row is None:
        fail("Event not found.")
    return {field: row[field]}


@tool("calendar_search_events", OWNER)
def search_events(w: World, query: Any = "", time_min: Any = None, time_max: Any = None, page: Any = 1,
                  page_size: Any = 5) -> dict[str, Any] | str:
    low = high = None
    if time_min:
        try:
            low = parse_ts(time_min)
        except ValueError:
            fail("Invalid time_min format. Expected YYYY-MM-DD HH:MM:SS.")
    if time_max:
        try:
            high = parse_ts(time_max)
        except ValueError:
            fail("Invalid time_max format. Expected YYYY-MM-DD HH:MM:SS.")
    # Terms are one regex over name or participant; NaN cells never match (na=False there).
    events = [r for r in w.tables[T]
              if contains(query, r["event_name"], na=False) or contains(query, r["participant_email"], na=False)]
    # NeMo Gym filters both bounds on the start time, whatever the schema says about time_min.
    if low is not None:
        events = [r for r in events if parse_ts(r["event_start"]) >= low]
    if high is not None:
        events = [r for r in events if parse_ts(r["event_start"]) <= high]
    if not events:
        return "No events found."
    events.sort(key=lambda r: parse_ts(r["event_start"]), reverse=True)  # latest first, stable on ties
    shown, info = paginate(events, page, page_size, "events")
    return {"events": records(shown), "pagination": info}


@tool("calendar_create_event", OWNER, mutating=True)
def create_event(w: World, event_name: Any = None, participant_email: Any = None, event_start: Any = None,
                 duration: Any = None) -> str:
    if not event_name:
        fail("Event name not provided.")
    if not participant_email:
        fail("Participant email not provided.")
    if not event_start:
        fail("Event start not provided.")
    if not duration:
        fail("Event duration not provided.")
    _check_start(event_start)
    _check_duration(duration)
    event_id = w.next_id(T, ID)
    # Values are stored as given (a numeric duration stays a number), exactly as NeMo Gym stores them.
    w.append(T, {"event_id": event_id, "event_name": event_name, "participant_email": participant_email.lower(),
                 "event_start": event_start, "duration": duration})
    return event_id


@tool("calendar_delete_event", OWNER, mutating=True)
def delete_event(w: World, event_id: Any = None) -> str:
    return delete_record(w, T, ID, event_id, "Event", check=_check_id)


@tool("calendar_update_event", OWNER, mutating=True)
def update_event(w: World, event_id: Any = None, field: Any = None, new_value: Any = None) -> str:
    if not event_id or not field or not new_value:
        fail("Event ID, field, or new value not provided.")
    _check_id(event_id)
    if field not in WRITABLE:
        fail(f"Invalid field. Available fields are: {', '.join(WRITABLE)}")
    if field == "event_start":
        _check_start(new_value)
    elif field == "duration":
        _check_duration(new_value)
    if w.find(T, ID, event_id) is None:
        fail("Event not found.")
    if field == "participant_email":
        new_value = new_value.lower()
    w.update(T, ID, event_id, field, new_value)
    return "Event updated successfully."
