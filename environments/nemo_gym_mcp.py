"""Tools a NeMo Gym resources server offers over MCP (`expose_tools_over_mcp: true` in its config).

Such a server's `/seed_session` reply carries `mcp: {server_name, url_path, transport, headers}`, a per-session
token in `headers`; its rows may offer no tools at all (`tools: []`), the agent lists them from that endpoint.
NeMo Gym serves it with the MCP SDK's streamable HTTP in stateless JSON mode, so one JSON-RPC `tools/list` POST
answers with no `initialize` handshake. Written here (one request, bounded) rather than pulling in the `mcp`
SDK and its server stack for it; a server that answers in another transport (SSE) is refused by name.

The calls themselves go to the tool's plain POST route with the session cookie, as NeMo Gym's simple agent makes
them and as the MCP endpoint dispatches them (the same handler, the same session).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any

from gymflow.environments import nemo_gym_catalogue as catalogue
from gymflow.environments import nemo_gym_http as http

from gymflow.kernel.errors import ConfigError, GymflowError
from gymflow.kernel.failures import ENVIRONMENT_ERROR
from gymflow.kernel.wire import ToolSpec

KEY = "mcp"  # NeMo Gym's NEMO_GYM_MCP_METADATA_KEY
MAX_TOOLS = 256
MAX_PAGES = 8
MAX_DESCRIPTION_CHARS = 4000
MAX_SCHEMA_BYTES = 64 * 1024
_HEADER_NAME = re.compile(r"[A-Za-z0-9-]{1,64}")
_HEADER_VALUE = re.compile(r"[\x21-\x7e]{1,2048}")
_PATH = re.compile(r"/[A-Za-z0-9_./-]{0,200}")
NameCheck = Callable[[str], str | None]  # a tool name -> what is wrong with it, or None


class McpError(GymflowError):
    """The server announced MCP tools and its endpoint did not list them: the episode cannot offer its tools."""

    failure_type = ENVIRONMENT_ERROR


def lists_tools(server: str, config: str | None, overrides: Mapping[str, Any] | None) -> bool:
    """Whether the server lists tools over MCP (its config, or the row's overrides, say
    `expose_tools_over_mcp: true`): the episode then offers them beside the row's own."""
    overridden = (overrides or {}).get("expose_tools_over_mcp")
    return overridden is True or (overridden is None and _exposes(server, config))


@cache
def _exposes(server: str, config: str | None) -> bool:
    try:
        return catalogue.exposes_mcp(catalogue.server(server), config)
    except ConfigError:
        return False


def endpoint(server: str, seed_reply: Any) -> tuple[str, dict[str, str]] | None:
    """(URL path, headers) of the MCP endpoint a `/seed_session` reply announces; None when it announces none."""
    meta = seed_reply.get(KEY) if isinstance(seed_reply, dict) else None
    if meta is None:
        return None
    if not isinstance(meta, dict):
        raise McpError(f"{server}/seed_session: `{KEY}` is not an object")
    path = meta.get("url_path", "/mcp")
    if not isinstance(path, str) or not _PATH.fullmatch(path) or ".." in path:
        raise McpError(f"{server}/seed_session: `{KEY}.url_path` is not a path on the server: {str(path)[:80]!r}")
    if meta.get("transport", "http") != "http":
        raise McpError(f"{server}/seed_session: MCP transport {str(meta.get('transport'))[:40]!r}; gymflow lists "
                       "tools over streamable HTTP only")
    headers = meta.get("headers") or {}
    if not isinstance(headers, dict) or not all(
            isinstance(k, str) and _HEADER_NAME.fullmatch(k) and isinstance(v, str) and _HEADER_VALUE.fullmatch(v)
            for k, v in headers.items()) or len(headers) > 8:
        raise McpError(f"{server}/seed_session: `{KEY}.headers` are not plain HTTP headers")
    return path, dict(headers)


def _spec(server: str, raw: Any, check_name: NameCheck) -> ToolSpec:
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        raise McpError(f"{server}: MCP tools/list: a tool without a name")
    name = raw["name"]
    if problem := check_name(name):
        raise McpError(f"{server}: MCP tools/list: tool {name[:80]!r}: {problem}")
    schema = raw.get("inputSchema") or {"type": "object", "properties": {}}
    if not isinstance(schema, dict) or len(json.dumps(schema)) > MAX_SCHEMA_BYTES:
        raise McpError(f"{server}: MCP tools/list: tool {name!r}: inputSchema is not an object under "
                       f"{MAX_SCHEMA_BYTES} bytes")
    description = raw.get("description") or ""
    return ToolSpec(name=name, description=str(description)[:MAX_DESCRIPTION_CHARS], parameters=schema)


async def list_tools(server: str, url: str, where: tuple[str, Mapping[str, str]], cookies: Mapping[str, str],
                     timeout: float, check_name: NameCheck) -> list[ToolSpec]:
    """The tools the endpoint lists for this session (`tools/list`, following `nextCursor` up to MAX_PAGES)."""
    path, headers = where
    headers = {**headers, "Accept": "application/json, text/event-stream"}
    tools: list[ToolSpec] = []
    cursor: str | None = None
    for page in range(1, MAX_PAGES + 1):
        params = {"cursor": cursor} if cursor else {}
        body = http.encode({"jsonrpc": "2.0", "id": page, "method": "tools/list", "params": params})
        reply = await http.with_retries(lambda b=body: http.post(url, path, b, cookies, timeout, headers=headers))
        if reply.status != 200:
            raise McpError(f"{server}{path}: MCP tools/list answered HTTP {reply.status}: {reply.snippet()}")
        try:
            answer = json.loads(reply.text)
        except ValueError:
            raise McpError(f"{server}{path}: MCP tools/list did not answer JSON (gymflow speaks its stateless JSON "
                           f"mode): {reply.snippet(120)}") from None
        result = answer.get("result") if isinstance(answer, dict) else None
        if not isinstance(result, dict) or not isinstance(result.get("tools"), list):
            error = answer.get("error") if isinstance(answer, dict) else None
            raise McpError(f"{server}{path}: MCP tools/list: {json.dumps(error)[:300] if error else 'no tools list'}")
        tools += [_spec(server, t, check_name) for t in result["tools"]]
        if len(tools) > MAX_TOOLS:
            raise McpError(f"{server}{path}: MCP tools/list: over {MAX_TOOLS} tools")
        cursor = result.get("nextCursor")
        if not cursor:
            names = [t.name for t in tools]
            if len(set(names)) != len(names):
                raise McpError(f"{server}{path}: MCP tools/list names a tool twice")
            return tools
        if not isinstance(cursor, str) or len(cursor) > 1024:
            raise McpError(f"{server}{path}: MCP tools/list: a nextCursor that is not a short string")
    raise McpError(f"{server}{path}: MCP tools/list: still paging after {MAX_PAGES} pages")
