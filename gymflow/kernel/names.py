"""Stable names shared by workflows, workers and the client: task queues, activities, search attributes.

Activity names are a versioned API: renaming one breaks workflows already in flight.
"""

from temporalio.common import SearchAttributeKey

WORKFLOWS_QUEUE = "gymflow-workflows"
ENV_QUEUE = "gymflow-env"
GENERATE_QUEUE = "gymflow-generate"

ROLLOUT_WORKFLOW = "RolloutWorkflow"

SETUP_EPISODE = "gymflow.setup_episode"
CALL_TOOL = "gymflow.call_tool"
VERIFY = "gymflow.verify"
GENERATE = "gymflow.generate"
PERSIST_ROLLOUT = "gymflow.persist_rollout"

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
