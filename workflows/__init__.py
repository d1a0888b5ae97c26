"""Workflow definitions: deterministic orchestration only. No I/O, no heavy imports."""
