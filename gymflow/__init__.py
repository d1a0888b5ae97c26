"""gymflow: durable LLM RL rollout collection on Temporal and Postgres.

Kept empty on purpose: lower layers import `gymflow.kernel`, and an import here would
pull the CLI and client into every worker and workflow sandbox.
"""
