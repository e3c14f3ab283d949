"""Making environments: vector envs for any gymnasium id, normalization, snapshot and restore, reward
delays and the testbed's own long-horizon tasks (registered as ``testbed/Chain-v0`` and ``testbed/KeyDoor-v0``)."""

from envs.delay import DelayedReward
from envs.errors import BadInput
from envs.factory import (
    EnvOptions,
    action_space_of,
    check_env_id,
    check_env_installed,
    episode_limit,
    is_continuous,
    make_vector,
)
from envs.tasks import ChainEnv, ChainVectorEnv, KeyDoorEnv, KeyDoorVectorEnv, reference_returns
from envs.vector_state import (
    freeze_normalizers,
    load_normalizer_state,
    load_vector_env_state,
    normalizer_state,
    vector_env_state,
)

__all__ = [
    "BadInput",
    "ChainEnv",
    "ChainVectorEnv",
    "DelayedReward",
    "EnvOptions",
    "KeyDoorEnv",
    "KeyDoorVectorEnv",
    "action_space_of",
    "check_env_id",
    "check_env_installed",
    "episode_limit",
    "freeze_normalizers",
    "is_continuous",
    "load_normalizer_state",
    "load_vector_env_state",
    "make_vector",
    "normalizer_state",
    "reference_returns",
    "vector_env_state",
]
