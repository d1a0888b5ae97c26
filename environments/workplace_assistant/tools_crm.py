"""CRM tools (NeMo Gym's CustomerRelationshipManagerTool): the `crm` table of customers."""

from __future__ import annotations

from typing import Any

from gymflow.environments.workplace_assistant.common import (
    contains,
    fail,
    paginate,
    records,
    text_at_least,
    text_at_most,
)
from gymflow.environments.workplace_assistant.registry import tool
from gymflow.environments.workplace_assistant.world import World, delete_record

OWNER = "CustomerRelationshipManagerTool"
T, ID = "crm", "customer_id"
STATUSES = ("Qualified", "Won", "Lost", "Lead", "Proposal")
PRODUCTS = ("Software", "Hardware", "Services", "Consulting", "Training")
FIELDS = ("customer_name", "assigned_to_email", "customer_email", "customer_phone", "last_contact_date",
          "product_interest", "status", "notes", "follow_up_by")


def _choices(values: tuple[str, ...]) -> str:
    return ", ".join(f"'{v}'" for v in values)


@tool("customer_relationship_manager_search_customers", OWNER)
def search_customers(w: World, customer_name: Any = None, customer_email: Any = None, product_interest: Any = None,
                     status: Any = None, assigned_to_email: Any = None, last_contact_date_min: Any = None,
                     last_contact_date_max: Any = None, follow_up_by_min: Any = None, follow_up_by_max: Any = None,
                     page: Any = 1, page_size: Any = 5) -> dict[str, Any] | str:
    filters = [customer_name, customer_email, product_interest, status, assigned_to_email, last_contact_date_min,
               last_contact_date_max, follow_up_by_min, follow_up_by_max]
    if not any(filters):
        fail("No search parameters provided. Please provide at least one parameter.")
    rows = w.tables[T]
    # Text filters are case-insensitive regex searches ("won" finds "Won"); a NaN cell makes pandas refuse.
    for column, pattern in (("customer_name", customer_name), ("customer_email", customer_email),
                            ("product_interest", product_interest), ("status", status),
                            ("assigned_to_email", assigned_to_email)):
        if pattern:
            rows = [r for r in rows if contains(pattern, r[column])]
    # Date bounds compare text: "2023-11-09" sorts before "2023-11-09 23:59:00", so a max excludes that day.
    for column, bound, keep in (("last_contact_date", last_contact_date_min, text_at_least),
                                ("last_contact_date", last_contact_date_max, text_at_most),
                                ("follow_up_by", follow_up_by_min, text_at_least),
                                ("follow_up_by", follow_up_by_max, text_at_most)):
        if bound:
            rows = [r for r in rows if keep(r[column], bound)]
    shown, info = paginate(rows, page, page_size, "customers")
    if not rows:
        return "No customers found."
    return {"customers": records(shown), "pagination": info}


@tool("customer_relationship_manager_update_customer", OWNER, mutating=True)
def update_customer(w: World, customer_id: Any = None, field: Any = None, new_value: Any = None) -> str:
    if not customer_id or not field or not new_value:
        fail("Customer ID, field, or new value not provided.")
    if field == "status" and new_value not in STATUSES:
        fail(f"Status not valid. Please choose from: {_choices(STATUSES)}")
    if field == "product_interest" and new_value not in PRODUCTS:
        fail(f"Product interest not valid. Please choose from: {_choices(PRODUCTS)}")
    if field in ("customer_email", "assigned_to_email"):
        new_value = new_value.lower()
    if w.find(T, ID, customer_id) is None:
        fail("Customer not found.")
    if field not in w.columns[T]:
        fail(f"Field not valid. Please choose from: {_choices(FIELDS)}")
    w.update(T, ID, customer_id, field, new_value)
    return "Customer updated successfully."


@tool("customer_relationship_manager_add_customer", OWNER, mutating=True)
def add_customer(w: World, customer_name: Any = None, assigned_to_email: Any = None, status: Any = None,
                 customer_email: Any = None, customer_phone: Any = None, last_contact_date: Any = None,
                 product_interest: Any = None, notes: Any = "", follow_up_by: Any = None) -> str:
    if not all([customer_name, assigned_to_email, status]):
        fail("Please provide all required fields: customer_name, assigned_to_email, status.")
    # No enum check on status here, unlike update: NeMo Gym stores whatever it is given.
    customer_id = w.next_id(T, ID)
    w.append(T, {"customer_id": customer_id, "customer_name": customer_name,
                 "customer_email": customer_email.lower() if customer_email else customer_email,
                 "customer_phone": customer_phone, "last_contact_date": last_contact_date,
                 "product_interest": product_interest, "status": status,
                 "assigned_to_email": assigned_to_email.lower(), "notes": notes, "follow_up_by": follow_up_by})
    return customer_id


@tool("customer_relationship_manager_delete_customer", OWNER, mutating=True)
def delete_customer(w: World, customer_id: Any = None) -> str:
    return delete_record(w, T, ID, customer_id, "Customer")
