"""Email tools (NeMo Gym's EmailTool): the `emails` table, inbox and outbox in one."""

from __future__ import annotations

from typing import Any

from gymflow.environments.workplace_assistant.common import fail, paginate, parse_ts, records
from gymflow.environments.workplace_assistant.registry import tool
from gymflow.environments.workplace_assistant.world import World, delete_record

OWNER = "EmailTool"
T, ID = "emails", "email_id"
NOW = "2023-11-30 23:59:00"  # NeMo Gym's HARDCODED_CURRENT_TIME: every sent email carries it


@tool("email_get_email_information_by_id", OWNER)
def get_email_information_by_id(w: World, email_id: Any = None, field: Any = None) -> dict[str, Any]:
    if not email_id:
        fail("Email ID not provided.")
    if not field:
        fail("Field not provided.")
    row = w.find(T, ID, email_id)
    if row is None:
        fail("Email not found.")
    if field not in row:
        fail(f"Field '{field}' not found. Available fields: {', '.join(row)}")
    return {field: row[field]}


@tool("email_search_emails", OWNER)
def search_emails(w: World, query: Any = "", date_min: Any = None, date_max: Any = None, page: Any = 1,
                  page_size: Any = 5) -> dict[str, Any] | str:
    try:
        words = query.lower().split()

        def matches(row: dict[str, Any]) -> bool:
            combined = f"{row['subject']} {row['body']} {row['sender/recipient']}".lower()
            return all(word in combined for word in words)  # plain substrings here, not regexes

        found = sorted((r for r in w.tables[T] if matches(r)), key=lambda r: parse_ts(r["sent_datetime"]),
                       reverse=True)
        if date_min:
            low = parse_ts(date_min).date()
            found = [r for r in found if parse_ts(r["sent_datetime"]).date() >= low]
        if date_max:
            high = parse_ts(date_max).date()  # inclusive: the whole day counts
            found = [r for r in found if parse_ts(r["sent_datetime"]).date() <= high]
        shown, info = paginate(found, page, page_size, "emails")
    except Exception as e:  # NeMo Gym wraps every failure of this tool in one message
        fail(f"Error searching emails: {e}")
    if not found:
        return "No emails found."
    return {"emails": records(shown), "pagination": info}


def _send(w: World, recipient: Any, subject: Any, body: Any) -> None:
    if not recipient or not subject or not body:
        fail("Recipient, subject, or body not provided.")
    if "@" not in recipient or "." not in recipient:
        fail("Invalid recipient email address.")
    try:
        # Unpadded on purpose: NeMo Gym's email ids are str(int(max) + 1), unlike the other tables.
        email_id = str(int(max(w.ids(T, ID))) + 1) if w.tables[T] else "1"
        w.append(T, {"email_id": email_id, "inbox/outbox": "outbox", "sender/recipient": recipient.lower(),
                     "subject": subject, "sent_datetime": NOW, "body": body})
    except Exception as e:
        fail(f"Error sending email: {e}")


@tool("email_send_email", OWNER, mutating=True)
def send_email(w: World, recipient: Any = None, subject: Any = None, body: Any = None) -> str:
    _send(w, recipient, subject, body)
    return "Email sent successfully."


@tool("email_delete_email", OWNER, mutating=True)
def delete_email(w: World, email_id: Any = None) -> str:
    return delete_record(w, T, ID, email_id, "Email")


@tool("email_forward_email", OWNER, mutating=True)
def forward_email(w: World, email_id: Any = None, recipient: Any = None) -> str:
    if not email_id or not recipient:
        fail("Email ID or recipient not provided.")
    if "@" not in recipient or "." not in recipient:
        fail("Invalid recipient email address.")
    row = w.find(T, ID, email_id)
    if row is None:
        fail("Email not found.")
    _send(w, recipient.lower(), f"FW: {row['subject']}", row["body"])
    return "Email forwarded successfully."


@tool("email_reply_email", OWNER, mutating=True)
def reply_email(w: World, email_id: Any = None, body: Any = None) -> str:
    if not email_id or not body:
        fail("Email ID or body not provided.")
    row = w.find(T, ID, email_id)
    if row is None:
        fail("Email not found.")
    # Inbox or outbox alike, the reply goes to the email's other party.
    _send(w, row["sender/recipient"], f"RE: {row['subject']}", body)
    return "Email replied successfully."
