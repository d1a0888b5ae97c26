"""Environment plug-ins: tools, episode state and verifiers. Knows nothing of Temporal."""
