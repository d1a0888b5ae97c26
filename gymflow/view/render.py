"""Templates (gymflow/view/templates) with autoescape on for every file: any string a model, an environment or a
dataset produced is escaped wherever it is printed, and nothing is marked safe except what this package builds."""

from __future__ import annotations

import json
from contextvars import ContextVar
from datetime import datetime
from typing import Any
from urllib.parse import quote

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

from gymflow.reports.text import fmt


def _when(value: datetime | None) -> str:
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


def _num(value: Any) -> str:
    return fmt(value)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _path(value: str) -> str:
    """One URL path segment: ids hold '/', so it is percent-encoded too."""
    return quote(value, safe="")


# The Content-Security-Policy nonce of the response being rendered (set per request by the app's middleware).
NONCE: ContextVar[str] = ContextVar("nonce", default="")

ENV = Environment(loader=PackageLoader("gymflow.view", "templates"), autoescape=select_autoescape(default=True),
                  undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
ENV.filters.update(when=_when, pretty=_pretty, num=_num, pct=_pct, path=_path)
ENV.globals["nonce"] = NONCE.get


def page(template: str, **context: Any) -> str:
    return ENV.get_template(template).render(**context)
