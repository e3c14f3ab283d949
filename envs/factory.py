"""One factory for vector environments of any registered gymnasium id.

Every env it makes:
- uses the NEXT_STEP autoreset mode, set explicitly and checked. After a step that ends an episode
  (``terminated | truncated``), the returned observation is the true final observation; the next
  ``step`` call ignores its action, resets that sub-env and returns the first observation of the new
  episode with reward 0. Rollouts mark that autoreset step as not a training sample.
- records episode statistics (``info["episode"]``) of the raw rewards, inside any reward scaling, with each
  episode's last reward (:class:`RecordEpisodes`);
- uses the native vectorized implementation where one exists (gymnasium's CartPole without kwargs, the
  testbed's tasks of :mod:`envs.tasks` with any kwargs but a time limit), else ``sync`` or ``async``
  vectorization;
- optionally delays rewards in each sub-env (:class:`envs.delay.DelayedReward`), which needs ``sync`` or
  ``async``: a native vector env has no sub-envs to wrap;
- optionally clips actions, normalizes observations and scales rewards with vector-level wrappers, so
  every sub-env shares one set of running statistics.
"""

from __future__ import annotations

import ctypes.util
import difflib
import functools
import importlib
import os
import sys
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv, VectorWrapper
from gymnasium.vector.utils import batch_space
from gymnasium.wrappers import vector as vector_wrappers

from envs import bsuite, custom
from envs.delay import Delay, DelayedReward, check_delay
from envs.errors import BadInput, brief
from envs.normalize import NormalizeObservation, NormalizeReward
from envs.tasks import TASK_IDS

Vectorization = Literal["auto", "native", "sync", "async"]

# Which extra each family needs, keyed by the entry point's module.
_EXTRAS = {"box2d": "gymnasium[box2d]", "mujoco": "gymnasium[mujoco]"}


@dataclass(frozen=True)
class EnvOptions:
    """How the vector env around a gymnasium id is built."""

    normalize_obs: bool = False
    """Running mean/std observation normalization, shared by all sub-envs."""
    normalize_reward: bool = False
    """Scale rewards by the running std of the discounted return (as SB3's VecNormalize)."""
    reward_norm_restart: Literal["terminated", "done"] = "terminated"
    """When that return starts again: at terminations only (gymnasium's) or at every episode end (SB3's);
    see ``envs.normalize.NormalizeReward``."""
    gamma: float = 0.99
    """Discount of the return whose std scales rewards."""
    clip_obs: float = 10.0
    """Normalized observations are clipped to [-clip_obs, clip_obs]."""
    clip_reward: float = 10.0
    """Scaled rewards are clipped to [-clip_reward, clip_reward]."""
    vectorization: Vectorization = "auto"
    """``auto``: native if the env has it (see the module docstring) and no reward delay, else sync."""
    reward_delay: Delay | None = None
    """Release each sub-env's rewards every k steps or at the episode's end (``"end"``); None or 1: as given."""
    reward_offset: float = 0.0
    """c, subtracted from every step's reward before any normalization: r' = r − c (ARS's alive-bonus
    offset). The episode statistics keep the env's own return."""
    stacked_seeds: int = 1
    """S: seeds sharing the vector env, sub-envs k·N … (k+1)·N − 1 seed k's, each with normalizer statistics
    of its own (``envs.normalize.SeedStatistics``)."""

    def __post_init__(self) -> None:
        if self.reward_delay is not None:
            check_delay(self.reward_delay)
        if self.stacked_seeds < 1:
            raise BadInput(f"stacked_seeds must be at least 1, got {self.stacked_seeds}")


def check_env_id(env_id: str) -> gym.envs.registration.EnvSpec:
    """Return the spec of a registered id, or raise BadInput naming the closest registered ids.

    ``module:EnvId`` first imports ``module`` (which registers its envs), as ``gym.make`` does: for an id the
    user typed. An id read from a file goes through :func:`check_saved_env_id` first. ``module:function`` names
    an env factory at the top of ``module`` (:mod:`envs.custom`); ``factory/…``, one given to this process.
    """
    module_name, colon, name = env_id.rpartition(":")
    if colon:
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            fix = "install the package that provides it"
            raise BadInput(f"{env_id}: cannot import {module_name!r} ({error}); {fix}") from None
        if (spec := custom.resolve_function(module, name)) is not None:
            return spec
        env_id = name
    if bsuite.is_bsuite(env_id) and env_id not in gym.registry:
        bsuite.register()  # Shimmy registers bsuite's envs as it is imported
    custom.check_known(env_id)
    if env_id in gym.registry:
        return gym.spec(env_id)
    closest = difflib.get_close_matches(env_id, list(gym.registry), n=5, cutoff=0.5)
    hint = f"Closest registered ids: {', '.join(closest)}." if closest else "No registered id is close."
    raise BadInput(
        f"Unknown environment id {env_id!r}. {hint} List them all with: python -c 'import gymnasium; "
        "gymnasium.pprint_registry()'"
    )


TRUST_FLAG = "--trust-env-module"
"""The option by which a user lets a run folder's ``module:EnvId`` be imported (as Hugging Face's
``trust_remote_code``)."""


def check_saved_env_id(env_id: Any, source: str, trust_module: bool = False) -> str:
    """The env id that a run folder, a preset or a committed result names, checked before anything is imported.

    Importing ``module`` of ``module:EnvId`` runs that module's code, and ``gym.make`` imports it by itself;
    with ``python -m lab`` the working folder is on ``sys.path``, so a file shipped beside a shared run folder
    would run. Such folders are data: an id without a module must be one gymnasium has registered (nothing
    is imported to find it), and one with a module is imported only when the user says so (``trust_module``,
    the command's ``--trust-env-module``). An id the user typed on the command line goes through
    :func:`check_env_id` instead. ``source`` names where the id was read, for the message."""
    if not isinstance(env_id, str) or not env_id.strip():
        raise BadInput(f"{source} has no env_id (a gymnasium id such as CartPole-v1); restore it")
    module, colon, _ = env_id.rpartition(":")
    if colon and not trust_module:
        raise BadInput(
            f"{source} names the env {brief(env_id, 80)}, which would import and run the module {brief(module, 60)}; "
            f"if you trust that code, add {TRUST_FLAG}"
        )
    check_env_id(env_id)
    return env_id


_GL_LIBRARIES = {"egl": ("EGL", "apt install libegl1"), "osmesa": ("OSMesa", "apt install libosmesa6")}
"""The off-screen GL back-ends MuJoCo offers on Linux: the library each loads, and how to install it."""
_GL_OFF = ("disable", "disabled", "off", "false", "0")
_GL_VALUES = ("", "glfw", "glx", "enable", "enabled", "on", "true", "1", *_GL_LIBRARIES, *_GL_OFF)
"""The values of MUJOCO_GL that MuJoCo takes on Linux; another one makes ``import mujoco`` raise."""


def video_fix(find_library: Callable[[str], str | None] | None = None) -> str:
    """How to let MuJoCo draw without a display here: the off-screen back-end whose library is installed."""
    find_library = find_library or ctypes.util.find_library
    installed = [name for name, (library, _) in _GL_LIBRARIES.items() if find_library(library)]
    if installed:
        return f"set MUJOCO_GL={installed[0]} ({_GL_LIBRARIES[installed[0]][0]} is installed here)"
    return "install EGL (apt install libegl1) or OSMesa (apt install libosmesa6) and set MUJOCO_GL to egl or osmesa"


def mujoco_gl_problem(
    render: bool,
    environ: Mapping[str, str] | None = None,
    find_library: Callable[[str], str | None] | None = None,
) -> str | None:
    """What keeps MuJoCo from loading (or, with ``render``, from drawing) under ``MUJOCO_GL``, with the fix; None
    where nothing is known to.

    ``import mujoco`` imports the GL back-end that MUJOCO_GL names, so a back-end whose library is missing
    (``MUJOCO_GL=osmesa`` without OSMesa) stops training too, which renders nothing, with a 40-line traceback
    from PyOpenGL. Unset, MuJoCo uses GLFW, which imports without a display but cannot draw without one."""
    environ = os.environ if environ is None else environ
    find_library = find_library or ctypes.util.find_library
    value = environ.get("MUJOCO_GL", "").strip().lower()
    fix = video_fix(find_library)
    if value not in _GL_VALUES:
        return (
            f"MUJOCO_GL={brief(value, 40)} is not a MuJoCo GL back-end (egl, osmesa, glfw). Fix: unset MUJOCO_GL to "
            f"train; to record videos {fix}"
        )
    if value in _GL_LIBRARIES and not find_library(_GL_LIBRARIES[value][0]):
        library, install = _GL_LIBRARIES[value]
        if render:
            return (
                f"MUJOCO_GL={value}, but the {library} library is not installed, so MuJoCo cannot draw. Fix: install "
                f"{library} ({install}), or {fix}"
            )
        return (
            f"MUJOCO_GL={value}, but the {library} library is not installed, and MuJoCo loads it as it is imported, "
            f"even to train. Fix: unset MUJOCO_GL to train (training renders nothing); to record videos {fix}"
        )
    if not render:
        return None
    if value in _GL_OFF:
        return f"MUJOCO_GL={value} turns MuJoCo's drawing off. Fix: {fix}"
    no_display = not environ.get("DISPLAY") and not environ.get("WAYLAND_DISPLAY")
    if value not in _GL_LIBRARIES and no_display and sys.platform.startswith("linux"):
        how = f"MUJOCO_GL={value} draws" if value else "With MUJOCO_GL unset, MuJoCo draws"
        return f"{how} in a window (GLFW), and this machine has no display (DISPLAY is unset). Fix: {fix}"
    return None


def check_mujoco_gl(env_id: str, render: bool) -> None:
    """For a MuJoCo env, BadInput with the fix where MUJOCO_GL keeps MuJoCo from loading, or with ``render``
    from drawing; checked before ``import mujoco``, which would fail with a traceback."""
    if "mujoco" in str(check_env_id(env_id).entry_point):
        problem = mujoco_gl_problem(render)
        if problem is not None:
            raise BadInput(problem)


def check_can_render(env_id: str) -> None:
    """Draw one frame of ``env_id``, before any work, or raise BadInput with the fix (``eval --video``).

    The known MUJOCO_GL cases first; then a real frame, since a back-end that loads may still fail to draw.
    GLFW warns twice about a missing display before the error that says the same: those warnings are
    silenced, so that the error's one line is all the user reads."""
    check_mujoco_gl(env_id, render=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            env = gym.make(env_id, render_mode="rgb_array")
            try:
                env.reset(seed=0)
                env.render()
            finally:
                env.close()
        except BadInput:
            raise
        except Exception as error:  # noqa: BLE001  rendering back-ends fail in many ways; all need the same fix
            raise BadInput(
                f"{env_id} cannot render here ({type(error).__name__}: {brief(str(error), 160)}). Fix: for MuJoCo on a "
                f"machine without a display, {video_fix()}"
            ) from None


@functools.cache
def quiet_mujoco_warnings() -> None:
    """Show each MuJoCo warning once, and none about ``settotalmass``.

    MuJoCo prints a deprecation warning about ``settotalmass`` each time it compiles a model that uses
    it, as gymnasium's own HalfCheetah asset does: 49 lines in one GRPO run, burying the progress lines,
    about a file the user cannot change. Worker processes forked after this keep the handler.
    """
    try:
        import mujoco
    except ImportError:
        return
    except Exception as error:  # noqa: BLE001  a GL back-end that fails to load raises anything (AttributeError)
        # mujoco imports the GL back-end MUJOCO_GL names as it is imported; mujoco_gl_problem catches the known cases.
        raise BadInput(
            f"MuJoCo cannot be imported with MUJOCO_GL={os.environ.get('MUJOCO_GL', '')!r} ({type(error).__name__}: "
            f"{brief(str(error), 120)}). Fix: unset MUJOCO_GL to train (training renders nothing); to record videos "
            f"{video_fix()}"
        ) from None
    seen: set[str] = set()

    def warn(message: str) -> None:
        if "settotalmass" not in message and message not in seen:
            seen.add(message)
            print(f"MuJoCo warning: {message}", file=sys.stderr)

    mujoco.set_mju_user_warning(warn)


def check_env_installed(env_id: str) -> None:
    """Build one env to prove its dependencies are installed; raise BadInput saying what to install."""
    spec = check_env_id(env_id)
    if "mujoco" in str(spec.entry_point):
        check_mujoco_gl(env_id, render=False)
        quiet_mujoco_warnings()
    try:
        gym.make(env_id).close()
    except gym.error.DependencyNotInstalled as error:
        entry = str(spec.entry_point)
        extra = next((name for key, name in _EXTRAS.items() if key in entry), None)
        fix = f"pip install '{extra}'" if extra else "install the package named above"
        raise BadInput(f"{env_id} needs a package that is not installed ({error}). Fix: {fix}") from None
    except ImportError as error:
        raise BadInput(f"{env_id} cannot be imported ({error}). Install the package that provides it.") from None


def action_space_of(env_id: str) -> gym.Space:
    """The action space of one env of ``env_id`` (validating the id and its dependencies first)."""
    check_env_installed(env_id)
    env = gym.make(env_id)
    try:
        return env.action_space
    finally:
        env.close()


def is_continuous(env: VectorEnv | gym.Env) -> bool:
    space = env.single_action_space if isinstance(env, VectorEnv) else env.action_space
    return isinstance(space, gym.spaces.Box)


class ClipAction(vector_wrappers.TransformAction):
    """gymnasium's vector ``ClipAction``, clipping the whole batch in one call: the same actions, cast to the
    sub-envs' dtype as gymnasium's copy into its output array casts them, and the same unbounded action
    space for the agent. gymnasium's clips sub-env by sub-env through its space utilities, about 20 µs a
    step, a seventh of a HalfCheetah step's own cost."""

    def __init__(self, env: VectorEnv) -> None:
        space = env.single_action_space
        unbounded = gym.spaces.Box(-np.inf, np.inf, space.shape, space.dtype)
        super().__init__(
            env,
            lambda actions: np.clip(actions, space.low, space.high).astype(space.dtype, copy=False),
            batch_space(unbounded, env.num_envs),
            unbounded,
        )


class RecordEpisodes(vector_wrappers.RecordEpisodeStatistics):
    """gymnasium's episode statistics (``info["episode"]``: return ``r``, length ``l``, time ``t``), plus ``last``:
    each ended episode's raw reward at its last step. bsuite scores some experiments by it (the umbrella's
    outcome, ±1, arrives there beside ±1 random rewards that its return mixes in)."""

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        obs, rewards, terminated, truncated, info = super().step(actions)
        if "episode" in info:
            info["episode"]["last"] = np.where(info["_episode"], rewards, 0.0)  # (N,)
        return obs, rewards, terminated, truncated, info


class RewardOffset(VectorWrapper):
    """r' = r − c on every step of an episode (ARS's alive-bonus offset). The step that a NEXT_STEP autoreset
    spends on the reset belongs to no episode and keeps its reward of 0, which gymnasium's TransformReward
    would shift too."""

    def __init__(self, env: VectorEnv, offset: float) -> None:
        super().__init__(env)
        self.offset = offset
        self.resetting = np.zeros(self.num_envs, dtype=np.bool_)  # (N,) this step is a sub-env's autoreset

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        self.resetting[:] = False
        return self.env.reset(**kwargs)

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        obs, rewards, terminated, truncated, info = self.env.step(actions)
        shifted = np.where(self.resetting, rewards, rewards - self.offset)
        self.resetting = np.logical_or(terminated, truncated)
        return obs, shifted, terminated, truncated, info


def make_vector(env_id: str, num_envs: int, options: EnvOptions = EnvOptions(), **env_kwargs: Any) -> VectorEnv:
    """Make ``num_envs`` copies of ``env_id`` as one vector env (NEXT_STEP autoreset), wrapped as above.

    The env is not reset here: the caller resets it with its seeds.
    """
    spec = check_env_id(env_id)
    check_env_installed(env_id)
    if num_envs < 1:
        raise BadInput(f"num_envs must be at least 1, got {num_envs}")
    if num_envs % options.stacked_seeds:
        raise BadInput(f"num_envs={num_envs} sub-envs cannot be split evenly among {options.stacked_seeds} seeds")
    delayed = options.reward_delay not in (None, 1)
    mode = options.vectorization
    if mode == "auto":
        # The testbed's vector tasks take the same kwargs as its single ones, but no time limit; gymnasium's
        # native envs take few of their single envs' kwargs.
        native_kwargs = not env_kwargs or (spec.id in TASK_IDS and "max_episode_steps" not in env_kwargs)
        mode = "native" if spec.vector_entry_point is not None and native_kwargs and not delayed else "sync"
    if mode == "native":
        if spec.vector_entry_point is None:
            raise BadInput(f"{env_id} has no native vectorized implementation; use vectorization=sync or async")
        if delayed:
            raise BadInput("a reward delay wraps each sub-env, which native vector envs lack; use vectorization=sync")
        kwargs = dict(env_kwargs)
        if spec.max_episode_steps is not None:
            kwargs.setdefault("max_episode_steps", spec.max_episode_steps)
        env = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="vector_entry_point", **kwargs)
    elif mode in ("sync", "async"):
        env = gym.make_vec(
            env_id,
            num_envs=num_envs,
            vectorization_mode=mode,
            vector_kwargs={"autoreset_mode": AutoresetMode.NEXT_STEP},
            wrappers=[functools.partial(DelayedReward, delay=options.reward_delay)] if delayed else None,
            **env_kwargs,
        )
    else:
        raise BadInput(f"vectorization must be one of auto, native, sync, async; got {mode!r}")
    if env.metadata.get("autoreset_mode") != AutoresetMode.NEXT_STEP:
        raise RuntimeError(f"{env_id}: expected the NEXT_STEP autoreset mode, got {env.metadata.get('autoreset_mode')}")

    obs_space = env.single_observation_space
    if not (isinstance(obs_space, gym.spaces.Box) and len(obs_space.shape) == 1):
        # Discrete, Tuple, Dict and image observations become flat vectors (Discrete one-hot).
        env = vector_wrappers.FlattenObservation(env)
    env = RecordEpisodes(env)
    if is_continuous(env):
        env = ClipAction(env)
    if options.normalize_obs:
        env = NormalizeObservation(env, clip=options.clip_obs, groups=options.stacked_seeds)
    if options.reward_offset:
        env = RewardOffset(env, options.reward_offset)
    if options.normalize_reward:
        env = NormalizeReward(
            env,
            gamma=options.gamma,
            clip=options.clip_reward,
            groups=options.stacked_seeds,
            restart=options.reward_norm_restart,
        )
    if env.metadata.get("autoreset_mode") != AutoresetMode.NEXT_STEP:
        raise RuntimeError("a wrapper changed the autoreset mode")
    return env


def episode_limit(env_id: str, **env_kwargs: Any) -> int | None:
    """The most steps an episode of ``env_id`` can last: the least of its time limit (``max_episode_steps``
    given, else the spec's) and the env's own ``horizon`` where it has one (a bsuite setting's fixed episode
    length); None if it has neither."""
    spec = check_env_id(env_id)
    time_limit = env_kwargs.get("max_episode_steps") or spec.max_episode_steps
    if bsuite.is_bsuite(env_id) and bsuite.experiment_of(env_id) in bsuite.EXPERIMENTS:
        kwargs = {k: v for k, v in env_kwargs.items() if k != "max_episode_steps"}
        limits = [int(n) for n in (time_limit, bsuite.episode_length(bsuite.experiment_of(env_id), **kwargs)) if n]
        return min(limits)
    env = gym.make(env_id, **env_kwargs)
    try:
        horizon = getattr(env.unwrapped, "horizon", None)
        # A factory's env (envs.custom) may hold a time limit of its own, inside the chain gym.make builds.
        inner = [w._max_episode_steps for w in wrapper_chain(env) if isinstance(w, gym.wrappers.TimeLimit)]
    finally:
        env.close()
    limits = [int(n) for n in (time_limit, horizon, *inner) if n is not None]
    return min(limits) if limits else None


def wrapper_chain(env: gym.Env) -> list[gym.Wrapper]:
    """The wrappers of one env, outermost first."""
    layers: list[gym.Wrapper] = []
    layer: Any = env
    while isinstance(layer, gym.Wrapper):
        layers.append(layer)
        layer = layer.env
    return layers


def vector_layers(env: VectorEnv) -> list[VectorWrapper]:
    """The wrappers of a vector env, outermost first."""
    layers: list[VectorWrapper] = []
    layer: Any = env
    while isinstance(layer, VectorWrapper):
        layers.append(layer)
        layer = layer.env
    return layers


def find_wrapper(env: VectorEnv, kind: type) -> Any | None:
    """The first wrapper of type ``kind`` in the chain, or None."""
    return next((layer for layer in vector_layers(env) if isinstance(layer, kind)), None)
