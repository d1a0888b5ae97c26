"""Training data from stored rollouts: token-exact records (records.py) and streaming exports (export.py)."""
