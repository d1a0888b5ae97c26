"""The trainer's policy-version calls, through a client (the store side: gymflow/kernel/store/policy_versions.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gymflow.kernel.store.policy_versions import Current, current_version, set_policy_version, version_problem

if TYPE_CHECKING:
    from gymflow.client import GymflowClient


async def declare_policy_version(client: GymflowClient, model: str, version: str) -> Current:
    """The trainer's call: `version` is now the current policy of the configured model `model`."""
    client.settings.model_config_for(model)  # an unknown model fails here, naming the configured ones
    if problem := version_problem(version):
        raise ValueError(problem)
    return await client.in_store(lambda s: set_policy_version(s, model, version),
                                 f"declaring policy version {version!r} of {model}")


async def current_policy_version(client: GymflowClient, model: str) -> Current | None:
    return await client.in_store(lambda s: current_version(s, model), f"reading the policy version of {model}")
