"""Tier (a) tests of agents/config.py, the PPOConfig dataclass (agents/ppo.py) and agents/presets/ppo.yaml."""

from __future__ import annotations

import dataclasses
from typing import Any

import gymnasium as gym
import pytest
import yaml

from agents.config import PRESET_DIR, build_config, load_preset, parse_overrides, resolve_config
from agents.ppo import PPOConfig
from envs.errors import BadInput


def ppo(**values: Any) -> PPOConfig:
    """build_config(PPOConfig, ...) for CartPole-v1 with the given raw values."""
    return build_config(PPOConfig, {"env_id": "CartPole-v1", **values})


def ppo_presets() -> dict[str, Any]:
    return yaml.safe_load((PRESET_DIR / "ppo.yaml").read_text())


# --------------------------------------------------------------------------------------------------
# Unknown keys
# --------------------------------------------------------------------------------------------------


def test_unknown_key_lists_valid_keys_and_suggests_closest() -> None:
    with pytest.raises(BadInput) as info:
        ppo(learning_rat=1e-3)
    message = str(info.value)
    assert "'learning_rat'" in message
    assert "did you mean 'learning_rate'?" in message
    assert "Valid keys:" in message
    for name in ("env_id", "gamma", "gae_lambda", "minibatch_size", "clip_range_vf", "device"):
        assert name in message


def test_unknown_key_without_close_match_still_lists_valid_keys() -> None:
    with pytest.raises(BadInput, match="Valid keys: env_id") as info:
        ppo(zzzzzz=1)
    assert "did you mean" not in str(info.value)


def test_bad_input_is_a_value_error() -> None:
    # The CLI catches BadInput; library callers may catch ValueError.
    assert issubclass(BadInput, ValueError)


# --------------------------------------------------------------------------------------------------
# Invalid values name the key and the valid range
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values, expected",
    [
        ({"gamma": 1.5}, r"gamma must be in \[0, 1\], got 1.5"),
        ({"gamma": -0.1}, r"gamma must be in \[0, 1\]"),
        ({"gae_lambda": 2}, r"gae_lambda must be in \[0, 1\]"),
        ({"clip_range": 0}, r"clip_range must be in \(0, 1\), got 0"),
        ({"clip_range": 1.0}, r"clip_range must be in \(0, 1\)"),
        # batch = n_steps · n_envs = 32 · 2 = 64 < 65
        ({"n_steps": 32, "n_envs": 2, "minibatch_size": 65}, r"minibatch_size must be in \[1, n_steps·n_envs = 64\]"),
        ({"minibatch_size": 0}, r"minibatch_size must be in \[1,"),
        ({"n_envs": 0}, r"n_envs must be at least 1, got 0"),
        ({"n_steps": 0}, r"n_steps must be at least 1"),
        ({"n_epochs": 0}, r"n_epochs must be at least 1"),
        ({"total_steps": 0}, r"total_steps must be positive"),
        ({"learning_rate": 0}, r"learning_rate must be positive"),
        ({"clip_range_vf": 0}, r"clip_range_vf must be positive or none"),
        ({"value_clip": "max"}, r"value_clip=max needs a clip_range_vf"),
        ({"value_clip": "maximum", "clip_range_vf": 0.2}, r"value_clip"),
        ({"target_kl": -0.01}, r"target_kl must be positive or none"),
        ({"ent_coef": -1}, r"ent_coef must be non-negative, got -1"),
        ({"max_grad_norm": 0}, r"max_grad_norm must be positive"),
        ({"hidden_sizes": "64,0"}, r"hidden_sizes must be positive widths"),
        ({"eval_episodes": 0}, r"eval_episodes must be at least 1"),
    ],
)
def test_invalid_value_names_key_and_range(values: dict[str, Any], expected: str) -> None:
    with pytest.raises(BadInput, match=expected):
        ppo(**values)


def test_minibatch_equal_to_batch_is_allowed() -> None:
    assert ppo(n_steps=32, n_envs=2, minibatch_size=64).num_minibatches == 1


@pytest.mark.parametrize(
    "key, value", [("total_steps", "1.5"), ("n_envs", "four"), ("anneal_lr", "maybe"), ("gamma", "high")]
)
def test_uncoercible_value_names_key(key: str, value: str) -> None:
    with pytest.raises(BadInput, match=f"{key}='{value}' is not a valid"):
        ppo(**{key: value})


@pytest.mark.parametrize("key, value", [("activation", "gelu"), ("vectorization", "threads"), ("device", "tpu")])
def test_invalid_choice_raises_naming_key(key: str, value: str) -> None:
    with pytest.raises(BadInput, match=key):
        ppo(**{key: value})


def test_invalid_choice_lists_valid_choices() -> None:
    with pytest.raises(BadInput) as info:
        ppo(activation="gelu")
    assert "tanh" in str(info.value) and "relu" in str(info.value)


# --------------------------------------------------------------------------------------------------
# Coercion of strings (command line) and YAML values
# --------------------------------------------------------------------------------------------------


def test_string_coercion() -> None:
    cfg = ppo(
        total_steps="1e5",
        anneal_lr="true",
        normalize_obs="no",
        hidden_sizes="256,256",
        clip_range_vf="none",
        gamma="0.9",
        seed="3",
        activation="relu",
    )
    assert cfg.total_steps == 100_000 and type(cfg.total_steps) is int
    assert cfg.anneal_lr is True and cfg.normalize_obs is False
    assert cfg.hidden_sizes == (256, 256)
    assert cfg.clip_range_vf is None
    assert cfg.gamma == 0.9 and cfg.seed == 3
    assert cfg.activation == "relu"


@pytest.mark.parametrize("text, expected", [("(128, 64)", (128, 64)), ("[32]", (32,)), ("16,", (16,))])
def test_tuple_coercion_forms(text: str, expected: tuple[int, ...]) -> None:
    assert ppo(hidden_sizes=text).hidden_sizes == expected


def test_optional_float_coercion() -> None:
    assert ppo(clip_range_vf="0.2").clip_range_vf == 0.2
    assert ppo(target_kl="null").target_kl is None
    assert ppo(target_kl=None).target_kl is None
    assert ppo(target_kl="0.01").target_kl == 0.01


def test_reward_delay_takes_a_number_of_steps_end_or_none() -> None:
    assert ppo(reward_delay="20").reward_delay == 20
    assert ppo(reward_delay="end").reward_delay == "end"
    assert ppo(reward_delay="none").reward_delay is None
    with pytest.raises(BadInput, match="reward_delay='soon' is not valid: give int, or 'end'"):
        ppo(reward_delay="soon")
    with pytest.raises(BadInput, match="reward_delay must be a number of steps >= 1"):
        ppo(reward_delay="0")


def test_env_kwargs_from_the_command_line_and_from_yaml() -> None:
    # key:value pairs, each value read as YAML: 300 an int, 0.1 a float, abc a string.
    cfg = ppo(env_kwargs="horizon:300, distractor_scale:0.1,name:abc")
    assert cfg.env_kwargs == {"horizon": 300, "distractor_scale": 0.1, "name": "abc"}
    assert ppo(env_kwargs={"horizon": 30}).env_kwargs == {"horizon": 30}
    assert ppo().env_kwargs == {}
    with pytest.raises(BadInput, match=r"env_kwargs: expected KEY:VALUE pairs, got \['horizon=300'\]; give KEY:VALUE"):
        ppo(env_kwargs="horizon=300")


def test_yaml_values_coerce() -> None:
    # YAML gives lists and native numbers: [256, 256] → (256, 256); an integral float → int.
    cfg = ppo(hidden_sizes=[256, 256], total_steps=2e5, anneal_lr=True)
    assert cfg.hidden_sizes == (256, 256) and cfg.total_steps == 200_000 and type(cfg.total_steps) is int


def test_config_is_frozen() -> None:
    cfg = ppo()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.gamma = 0.5  # type: ignore[misc]


# --------------------------------------------------------------------------------------------------
# parse_overrides
# --------------------------------------------------------------------------------------------------


def test_parse_overrides_splits_on_first_equals() -> None:
    assert parse_overrides(["a=1", "b=x=y"]) == {"a": "1", "b": "x=y"}


def test_parse_overrides_strips_and_allows_empty_value() -> None:
    assert parse_overrides([" lr = 3e-4 ", "clip_range_vf="]) == {"lr": "3e-4", "clip_range_vf": ""}


@pytest.mark.parametrize("pair", ["novalue", "=5", " =5"])
def test_parse_overrides_malformed_raises(pair: str) -> None:
    with pytest.raises(BadInput, match="key=value"):
        parse_overrides([pair])


# --------------------------------------------------------------------------------------------------
# Presets
# --------------------------------------------------------------------------------------------------


def test_cartpole_preset_has_rl_zoo_values() -> None:
    cfg, name = resolve_config(PPOConfig, "ppo", "CartPole-v1", False, {})
    assert name == "CartPole-v1"
    assert (cfg.n_envs, cfg.n_steps, cfg.minibatch_size, cfg.n_epochs) == (8, 32, 256, 20)
    assert (cfg.gamma, cfg.gae_lambda) == (0.98, 0.8)
    assert cfg.learning_rate == 1e-3 and cfg.anneal_lr  # zoo: lin_1e-3
    assert cfg.clip_range == 0.2 and cfg.anneal_clip_range  # zoo: lin_0.2
    assert cfg.ent_coef == 0.0 and cfg.total_steps == 100_000
    # Values the entry does not set come from the discrete default.
    assert cfg.vf_coef == 0.5 and cfg.max_grad_norm == 0.5
    # 100000 / (32 · 8 = 256) = 390.6 → 391 iterations of one minibatch each.
    assert (cfg.batch_size, cfg.num_minibatches, cfg.num_iterations) == (256, 1, 391)


def test_half_cheetah_preset_has_its_studys_trial_8_values() -> None:
    cfg, name = resolve_config(PPOConfig, "ppo", "HalfCheetah-v5", True, {})
    assert name == "HalfCheetah-v5"
    assert cfg.learning_rate == 6.626235648340379e-05 and not cfg.anneal_lr
    assert (cfg.n_envs, cfg.n_steps, cfg.minibatch_size, cfg.n_epochs) == (1, 1024, 256, 20)
    assert (cfg.gamma, cfg.gae_lambda, cfg.clip_range) == (0.99, 0.92, 0.2)
    assert (cfg.ent_coef, cfg.vf_coef, cfg.max_grad_norm) == (2.532299819667241e-08, 0.9008510636587208, 0.5)
    assert cfg.hidden_sizes == (256, 256) and cfg.activation == "relu"
    assert cfg.ortho_init is False and cfg.log_std_init == -0.9666898400402343
    assert cfg.recompute_advantages and not cfg.normalize_advantage
    assert cfg.normalize_obs and cfg.normalize_reward  # from the continuous default


def test_unlisted_discrete_env_gets_discrete_default() -> None:
    cfg, name = resolve_config(PPOConfig, "ppo", "Acrobot-v1", False, {})
    assert name == "default (discrete)"
    assert cfg.env_id == "Acrobot-v1"
    assert (cfg.n_envs, cfg.n_steps, cfg.minibatch_size, cfg.n_epochs) == (4, 128, 128, 4)
    assert cfg.learning_rate == 2.5e-4 and cfg.anneal_lr and cfg.ent_coef == 0.01
    assert not cfg.normalize_obs and not cfg.normalize_reward
    # batch 4 · 128 = 512, 512 // 128 = 4 minibatches, 500000 / 512 = 976.6 → 977 iterations
    assert (cfg.batch_size, cfg.num_minibatches, cfg.num_iterations) == (512, 4, 977)


def test_unlisted_continuous_env_gets_continuous_default() -> None:
    cfg, name = resolve_config(PPOConfig, "ppo", "Pendulum-v1", True, {})
    assert name == "default (continuous)"
    assert (cfg.n_envs, cfg.n_steps, cfg.minibatch_size, cfg.n_epochs) == (1, 2048, 64, 10)
    assert cfg.learning_rate == 3e-4 and cfg.anneal_lr and cfg.ent_coef == 0.0
    assert cfg.normalize_obs and cfg.normalize_reward
    # batch 2048, 2048 // 64 = 32 minibatches, 1e6 / 2048 = 488.3 → 489 iterations
    assert (cfg.batch_size, cfg.num_minibatches, cfg.num_iterations) == (2048, 32, 489)


def test_overrides_apply_on_top_of_preset_and_are_validated() -> None:
    cfg, _ = resolve_config(PPOConfig, "ppo", "CartPole-v1", False, {"gamma": "0.9", "seed": "7"})
    assert cfg.gamma == 0.9 and cfg.seed == 7 and cfg.n_steps == 32
    # Two envs of 32 steps make a batch of 64, smaller than the preset's minibatch of 256.
    with pytest.raises(BadInput, match="minibatch_size"):
        resolve_config(PPOConfig, "ppo", "CartPole-v1", False, {"n_envs": "2"})
    with pytest.raises(BadInput, match="did you mean 'n_envs'"):
        resolve_config(PPOConfig, "ppo", "CartPole-v1", False, {"n_env": "2"})


def test_load_preset_does_not_mutate_defaults() -> None:
    values, _ = load_preset("ppo", "CartPole-v1", False)
    assert values["n_envs"] == 8
    default, name = load_preset("ppo", "Acrobot-v1", False)
    assert name == "default (discrete)" and default["n_envs"] == 4


def test_every_preset_key_is_a_config_field() -> None:
    names = {f.name for f in dataclasses.fields(PPOConfig)}
    presets = ppo_presets()
    for values in [*presets["defaults"].values(), *presets["envs"].values()]:
        assert set(values) <= names, set(values) - names


@pytest.mark.parametrize("env_id", list(ppo_presets()["envs"]))
def test_every_env_preset_builds_a_valid_config(env_id: str) -> None:
    env = gym.make(env_id)  # the id is registered and its action space picks the default
    continuous = isinstance(env.action_space, gym.spaces.Box)
    env.close()
    cfg, name = resolve_config(PPOConfig, "ppo", env_id, continuous, {})
    assert name == env_id and cfg.env_id == env_id
    assert cfg.minibatch_size <= cfg.batch_size and cfg.num_iterations >= 1


# --------------------------------------------------------------------------------------------------
# Derived properties
# --------------------------------------------------------------------------------------------------


def test_derived_properties() -> None:
    # batch = 128 · 4 = 512; 512 // 100 = 5 minibatches (the remainder is spread over them);
    # iterations = ⌈1000 / 512⌉ = 2
    cfg = PPOConfig(env_id="CartPole-v1", n_steps=128, n_envs=4, minibatch_size=100, total_steps=1000)
    assert (cfg.batch_size, cfg.num_minibatches, cfg.num_iterations) == (512, 5, 2)
    # An exact multiple: ⌈1024 / 512⌉ = 2, not 3.
    assert dataclasses.replace(cfg, total_steps=1024).num_iterations == 2
    # total_steps smaller than one batch still runs one iteration.
    assert dataclasses.replace(cfg, total_steps=1).num_iterations == 1


def test_defaults_are_valid() -> None:
    cfg = PPOConfig(env_id="CartPole-v1")
    assert (cfg.batch_size, cfg.num_minibatches, cfg.num_iterations) == (2048, 32, 489)
