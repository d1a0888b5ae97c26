"""Rows in: load and validate JSONL datasets per environment, route rows to the right one, prepare files."""
