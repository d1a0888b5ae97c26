"""Stable names shared by workflows, workers and the client: task queues, activities, search attributes.

Activity names are a versioned API: renaming one breaks workflows already in flight.
"""

from temporalio.common import SearchAttributeKey

WORKFLOWS_QUEUE = "gymflow-workflows"
ENV_QUEUE = "gymflow-env"
GENERATE_QUEUE = "gymflow-generate"  # the prefix of each model's generate queue


def generate_queue(model: str) -> str:
    """The generate task queue of one configured model (its key under `models:`): a worker polls only the
    queues of the models it has, so a rollout waits for a worker that can serve it instead of failing."""
    return f"{GENERATE_QUEUE}-{model}"


# The episode workflow (docs/design-episode-data.md) and its activities.
EPISODE_WORKFLOW = "EpisodeWorkflow"
EPISODE_BEGIN = "gymflow.episode.begin"
EPISODE_GENERATE = "gymflow.episode.generate"
EPISODE_RUN_TOOLS = "gymflow.episode.run_tools"
EPISODE_FINISH = "gymflow.episode.finish"
EPISODE_TURN = "gymflow.episode.turn"  # generate + run_tools in one local activity (generation and env local)

SA_RUN = SearchAttributeKey.for_keyword("GymflowRun")
SA_ENV = SearchAttributeKey.for_keyword("GymflowEnv")
SA_MODEL = SearchAttributeKey.for_keyword("GymflowModel")
SA_STATUS = SearchAttributeKey.for_keyword("GymflowStatus")
SA_REWARD = SearchAttributeKey.for_float("GymflowReward")

# name -> CLI type for `temporal server start-dev --search-attribute NAME=TYPE`
SEARCH_ATTRIBUTES = {
    SA_RUN.name: "Keyword", SA_ENV.name: "Keyword", SA_MODEL.name: "Keyword",
    SA_STATUS.name: "Keyword", SA_REWARD.name: "Double",
}
