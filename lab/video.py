"""Recording one evaluation episode as a GIF (imageio, which gymnasium's MuJoCo extra installs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from envs.errors import BadInput
from envs.factory import video_fix


def record_episode(
    model: Any, env_id: str, normalizers: dict[str, Any], out_dir: Path, seed: int, deterministic: bool
) -> Path:
    """Play one episode from ``seed`` with frozen observation statistics; write ``out_dir/ENV-seedS.gif``."""
    import imageio.v2 as imageio  # here: only `eval --video` needs it

    try:
        env = gym.make(env_id, render_mode="rgb_array")
        obs, _ = env.reset(seed=seed)
        frames = [env.render()]
    except Exception as error:  # noqa: BLE001  rendering back-ends fail in many ways; all need the same fix
        raise BadInput(
            f"{env_id} cannot render here ({type(error).__name__}: {error}). Fix: for MuJoCo on a machine without a "
            f"display, {video_fix()}"
        ) from None
    rms = normalizers.get("obs_rms")
    done = False
    with torch.inference_mode():
        while not done:
            x = np.asarray(obs, dtype=np.float32).reshape(-1)
            if rms is not None:
                x = np.clip((x - rms["mean"]) / np.sqrt(rms["var"] + 1e-8), -10.0, 10.0).astype(np.float32)
            obs_t = torch.from_numpy(x).unsqueeze(0)
            action = model.deterministic_action(obs_t) if deterministic else model.act(obs_t).actions
            action = action[0].numpy()
            if isinstance(env.action_space, gym.spaces.Box):
                action = np.clip(action, env.action_space.low, env.action_space.high)
            obs, _, terminated, truncated, _ = env.step(action)
            frames.append(env.render())
            done = terminated or truncated
    env.close()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{env_id.replace('/', '_')}-seed{seed}.gif"
    imageio.mimsave(path, frames[::2], duration=1000 * 2 / env.metadata.get("render_fps", 30))
    return path
