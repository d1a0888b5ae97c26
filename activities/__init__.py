"""Activity implementations: the work a rollout schedules. Heavy imports live here, never in workflows."""
