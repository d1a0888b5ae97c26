"""The codec server (`gymflow codec`): Temporal's UI and CLI send it history payloads to decode, and it
expands the message ids of the by-reference workflow (docs/design-episode-data.md) into the messages they
name, so a person inspecting a rollout in the UI still reads the conversation.

- render.py: a stored message -> a short, capped summary (role, content, tool calls);
- messages.py: reads messages by id from Postgres, read-only and bounded in time;
- payloads.py: the codec protocol's payload list -> the same list with `head_message` added beside `head_id`;
- server.py: the HTTP endpoint (`POST /decode`, `/encode`, CORS) and its limits.
"""
