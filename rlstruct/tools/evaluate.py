"""``rlstruct evaluate RUN_DIR``: play a saved policy greedily and report its return.

A checkpoint written by :class:`~rlstruct.runs.run.Run` holds what rebuilds the policy without
reading the algorithm's code: the config (env id, env modules), the constructor call of each
model built with :meth:`~rlstruct.runs.run.Run.model` (class, arguments), the model's weights, and
the evaluation agent (class, arguments, the ``agent_info`` that makes it greedy).
:func:`evaluate` rebuilds them, plays ``n_episodes`` full episodes in this process (one env per
episode, a :class:`~rlstruct.SerialBatcher`) and returns their returns; ``video_dir`` also
records the first episode with gymnasium's ``RecordVideo`` (which needs ``moviepy``).

Example (shell)::

    rlstruct evaluate runs/ppo_CartPole-v1_20261125-101500 --checkpoint best
    # ppo CartPole-v1, best.pt at 20,480 frames: 10 greedy episodes, return 500.00 ± 0.00 ...
"""

from __future__ import annotations

import functools
import importlib.util
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym

from rlstruct.batchers import SerialBatcher
from rlstruct.envs import GymEnv
from rlstruct.envs.registry import ATARI_BACKENDS, env_factory, env_spec, import_env_modules
from rlstruct.errors import ConfigError
from rlstruct.runs.checkpoint import load_checkpoint, rebuild_agent, recorded_env
from rlstruct.runs.episodes import EpisodeTracker
from rlstruct.runs.folder import RunFolder

__all__ = ["evaluate", "describe", "VIDEO_HINT"]

#: What ``--video`` prints when gymnasium's RecordVideo cannot run here.
VIDEO_HINT = ("--video needs moviepy, which gymnasium's RecordVideo uses to write the files "
              "(the video extra: pip install -e '.[video]'); evaluating without a video")


def evaluate(
    run_dir: str | Path,
    checkpoint: str = "latest",
    n_episodes: int = 10,
    device: str = "cpu",
    seed: int | None = None,
    video_dir: str | Path | None = None,
    timeout_s: float = 600.0,
) -> tuple[list[float], dict[str, Any]]:
    """Plays ``n_episodes`` greedy episodes of the policy saved in ``run_dir``.

    Args:
        run_dir: a run directory (``checkpoints/<checkpoint>.pt`` inside).
        checkpoint: ``"latest"`` or ``"best"``.
        n_episodes: episodes to play, each in an env of its own.
        device: where the agent runs.
        seed: the envs' seed (default: the run's seed + 2000, apart from the training and the
            evaluations during training).
        video_dir: record the first episode there (needs moviepy; without it a warning is
            printed and no video is written).
        timeout_s: give up when the episodes have not ended after this many seconds.

    Returns:
        ``(returns, checkpoint state)``: one return per episode, in env order.

    Raises:
        ConfigError: a bad argument.
        CheckpointError: no such checkpoint, or it does not record how to rebuild the policy
            (written before rlstruct recorded it, or a model not built with ``run.model``) or
            the env (a config without ``env_id``).
        TimeoutError: the episodes did not end within ``timeout_s``.
    """
    if checkpoint not in ("latest", "best") or n_episodes < 1:
        raise ConfigError(f"need checkpoint 'latest' or 'best' and n_episodes >= 1; got "
                          f"{checkpoint!r} and {n_episodes}")
    path = RunFolder(Path(run_dir)).checkpoint(checkpoint)
    state = load_checkpoint(path)
    cfg = state.get("config") or {}
    env_id, backend, modules = recorded_env(state, path)
    create_agent, agent_args, agent_info = rebuild_agent(state, path)
    import_env_modules(modules)
    factories = [env_factory(env_id, backend)] * n_episodes
    if video_dir is not None:
        if cfg.get("env_backend") in ATARI_BACKENDS:
            print("rlstruct evaluate: --video does not record Atari runs yet; "
                  "evaluating without a video", flush=True)
        elif importlib.util.find_spec("moviepy") is None:
            print(f"rlstruct evaluate: {VIDEO_HINT}", flush=True)
        elif (problem := _render_problem(factories[0])) is not None:
            print(f"rlstruct evaluate: --video: {env_id} cannot render ({problem}); "
                  "evaluating without a video", flush=True)
        else:
            factories[0] = functools.partial(_recorded, factories[0], Path(video_dir))
    spec = env_spec(env_id) if cfg.get("env_backend") not in ATARI_BACKENDS else None
    batcher = SerialBatcher(
        n_timesteps=(spec and spec.max_episode_steps) or 1000, create_agent=create_agent,
        agent_args=agent_args, create_env=GymEnv, env_args={"env": factories},
        seeds=cfg.get("seed", 0) + 2000 if seed is None else seed, agent_info=agent_info,
        device=device,
    )
    tracker, returns = EpisodeTracker(), []
    deadline = time.monotonic() + timeout_s
    with batcher:
        batcher.reset(agent_info=agent_info)
        batcher.execute()
        while True:
            traj, n_running = batcher.get()
            returns += tracker(traj)[0].tolist()
            if not n_running:
                return returns, state
            if time.monotonic() > deadline:
                raise TimeoutError(f"evaluate: {n_running} of {n_episodes} episodes of {env_id} "
                                   f"still running after {timeout_s} s")
            batcher.execute()


def describe(returns: list[float], state: dict[str, Any], checkpoint: str) -> str:
    """One line: the run, the checkpoint, and the mean ± std (min, max) return."""
    n = len(returns)
    mean = sum(returns) / n
    std = math.sqrt(sum((r - mean) ** 2 for r in returns) / n)
    env = state.get("config", {}).get("env_id", "?")
    return (f"{state.get('algo', '?')} {env}, {checkpoint}.pt at {state.get('frames', 0):,} "
            f"frames: {n} greedy episodes, return {mean:.2f} ± {std:.2f} "
            f"(min {min(returns):.2f}, max {max(returns):.2f})")


def _render_problem(make: Callable[..., gym.Env]) -> str | None:
    """Why ``make``'s env cannot render frames (e.g. pygame missing), else None."""
    try:
        env = make()
        modes = env.metadata.get("render_modes", [])
        env.close()
        if "rgb_array" not in modes:
            return f"its render modes are {modes}, not rgb_array"
        env = make(render_mode="rgb_array")
        try:
            env.reset(seed=0)
            frame = env.render()
        finally:
            env.close()
    except Exception as err:  # noqa: BLE001 - a missing renderer, no render_mode: no video
        return f"{type(err).__name__}: {err}"
    return None if hasattr(frame, "shape") else "its render() returns no image"


def _recorded(make: Callable[..., gym.Env], folder: Path) -> gym.Env:
    env = make(render_mode="rgb_array")
    return gym.wrappers.RecordVideo(env, str(folder), episode_trigger=lambda episode: True,
                                    disable_logger=True)
