"""NeMo Gym's workplace assistant: multi-step tool use over a simulated company, verified by state."""

from gymflow.environments.workplace_assistant.env import WorkplaceAssistantEnvironment, WorkplaceTask

__all__ = ["WorkplaceAssistantEnvironment", "WorkplaceTask"]
