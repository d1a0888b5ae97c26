"""Glue for outside trainers: `gymflow.integrations.trl` (TRL's GRPOTrainer `rollout_func`, the weight sync).

Importing this package imports no trainer library; each module imports its own only where it needs it.
"""
