"""Processes: worker-pool entrypoints and the embedded local stack."""
