"""Making environments: vector envs for any gymnasium id, normalization, snapshot and restore."""

from envs.errors import BadInput
from envs.factory import EnvOptions, action_space_of, check_env_id, check_env_installed, is_continuous, make_vector
from envs.vector_state import (
    freeze_normalizers,
    load_normalizer_state,
    load_vector_env_state,
    normalizer_state,
    vector_env_state,
)

__all__ = [
    "BadInput",
    "EnvOptions",
    "action_space_of",
    "check_env_id",
    "check_env_installed",
    "freeze_normalizers",
    "is_continuous",
    "load_normalizer_state",
    "load_vector_env_state",
    "make_vector",
    "normalizer_state",
    "vector_env_state",
]
