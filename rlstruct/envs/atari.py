"""Atari envs with the standard preprocessing, uint8 frames from the emulator to the buffer.

:func:`make_atari_env` builds ``N`` ALE envs (``ale-py`` ships the ROMs and registers the
``ALE/<Game>-v5`` ids with gymnasium) behind one :class:`~rlstruct.envs.GymEnvInf`
(auto-reset) or :class:`~rlstruct.envs.GymEnv` (episodic). Each env is

    e = gym.make(env, frameskip=1, full_action_space=False)  # + repeat_action_probability
    e = AtariPreprocessing(e, noop_max, frame_skip, screen_size, terminal_on_life_loss)
    e = FrameStackObservation(e, frame_stack)
    e = TimeLimit(e, max_episode_steps)  # only when max_episode_steps is given

so its observation is ``Box(0, 255, (frame_stack, screen_size, screen_size), uint8)``: the
VecEnv's ``frame`` is ``(N, 4, 84, 84)`` uint8 by default, and a batcher stores it as uint8
(``(B, T, 4, 84, 84)``, 28 224 bytes per observation). Nothing is scaled or cast to float on
the way: a network divides by 255 itself (:class:`~rlstruct.blocks.nets.CNNActorCritic` does).

Preprocessing (gymnasium's ``AtariPreprocessing``, after Machado et al. 2018): the base env
runs at ``frameskip=1``; the wrapper repeats each action ``frame_skip`` times, summing the
rewards and max-pooling the last two frames; the frame is turned grey and resized to
``screen_size`` x ``screen_size`` (OpenCV, ``INTER_AREA``); at each reset it plays a random
number of no-ops in ``[1, noop_max]`` (0: none). Rewards are NOT clipped (clip them in the
learner if the algorithm wants it). The v5 ids keep sticky actions
(``repeat_action_probability`` 0.25 per emulator frame) unless told otherwise, and the
minimal action set (6 actions for Pong).

Episode ends: ``terminated`` at game over (and, with ``terminal_on_life_loss=True``, at every
life lost: gymnasium's wrapper then RESETS the game at each life lost, unlike the
``EpisodicLifeEnv`` of Baselines, which only resets at game over); ``truncated`` when ALE's
frame limit of the id is reached (108 000 emulator frames for v5, i.e. 27 000 agent steps at
``frame_skip=4``) or after ``max_episode_steps`` AGENT steps (a ``TimeLimit`` outside the frame
skip).

Seeds: env ``k`` of ``make_atari_env(..., seed=s)`` is reset with ``seed=s + k`` on its first
reset (ALE's generator for sticky actions, and the no-op counts), as every ``GymEnv``: the same
seed gives the same frames under the same actions.

Requirements: the ``atari`` extra, ``pip install -e '.[atari]'`` (ale-py, and OpenCV for the resize;
headless build). Without them :func:`make_atari_env` raises an ``ImportError`` saying so; this
module itself imports without them.
"""

from __future__ import annotations

import importlib
import inspect
import multiprocessing
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, TypedDict

import gymnasium as gym

from rlstruct.envs.gym import GymEnv, GymEnvInf
from rlstruct.errors import ConfigError, install_hint

if TYPE_CHECKING:  # typing.Unpack is Python >= 3.11's
    from typing_extensions import Unpack

__all__ = ["make_atari_env", "make_atari_gym_env", "register_atari_envs", "AtariPreprocessing",
           "quiet_ale_banner"]

ATARI_INSTALL_HINT = (
    "Atari envs need ale-py (it ships the ROMs) and OpenCV (gymnasium's AtariPreprocessing "
    f"resizes with cv2): {install_hint('atari')}"
)


def quiet_ale_banner() -> None:
    """ALE's emulators of this process start without the banner (``A.L.E: Arcade Learning
    Environment ... [Powered by Stella]``, which ALE prints on stderr at every one it starts):
    a run shows it once, at the main process's first Atari env, and its worker processes
    never. ALE's errors still print."""
    ale_py = importlib.import_module("ale_py")
    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)


def register_atari_envs() -> None:
    """Imports ale-py, which registers the ``ALE/...`` ids with gymnasium, and checks that
    OpenCV imports (idempotent).

    Raises:
        ImportError: ale-py or OpenCV is missing (the message says what to install).
    """
    for module in ("ale_py", "cv2"):
        try:
            mod = importlib.import_module(module)
        except ImportError as e:
            raise ImportError(f"{ATARI_INSTALL_HINT} ({type(e).__name__}: {e})") from e
        if module == "ale_py":
            gym.register_envs(mod)


class AtariPreprocessing(TypedDict, total=False):
    """The preprocessing options of :func:`make_atari_gym_env`, which :func:`make_atari_env`
    passes on (each optional: the function's default applies)."""

    frame_skip: int
    frame_stack: int
    screen_size: int
    noop_max: int
    terminal_on_life_loss: bool
    max_episode_steps: int | None
    repeat_action_probability: float | None


def make_atari_gym_env(
    env: str = "ALE/Pong-v5",
    *,
    frame_skip: int = 4,
    frame_stack: int = 4,
    screen_size: int = 84,
    noop_max: int = 30,
    terminal_on_life_loss: bool = False,
    max_episode_steps: int | None = None,
    repeat_action_probability: float | None = None,
) -> gym.Env:
    """One preprocessed Atari env (see the module doc); observations ``(frame_stack,
    screen_size, screen_size)`` uint8.

    Args:
        env: an ALE id registered with gymnasium (``"ALE/Pong-v5"``, ``"ALE/Breakout-v5"``...).
        frame_skip: emulator frames per agent step (rewards summed, last two frames max-pooled).
        frame_stack: the last ``frame_stack`` preprocessed frames form the observation.
        screen_size: the side of the square grey frame.
        noop_max: at most this many no-ops at reset (0: none).
        terminal_on_life_loss: end the episode (and reset the game) at every life lost.
        max_episode_steps: truncate after this many agent steps (``None``: ALE's own limit).
        repeat_action_probability: sticky actions (``None``: the id's default, 0.25 for v5).

    Returns:
        The wrapped gymnasium env (not yet reset).

    Raises:
        ImportError: ale-py or OpenCV is missing.
    """
    register_atari_envs()
    make_kwargs: dict[str, object] = {"frameskip": 1, "full_action_space": False}
    if repeat_action_probability is not None:
        make_kwargs["repeat_action_probability"] = float(repeat_action_probability)
    if multiprocessing.parent_process() is not None:  # a worker: the main process showed it
        quiet_ale_banner()
    e = gym.make(env, **make_kwargs)
    quiet_ale_banner()  # ALE prints its banner at every emulator it starts: once is enough
    e = gym.wrappers.AtariPreprocessing(
        e, noop_max=noop_max, frame_skip=frame_skip, screen_size=screen_size,
        terminal_on_life_loss=terminal_on_life_loss, grayscale_obs=True,
        grayscale_newaxis=False, scale_obs=False)
    e = gym.wrappers.FrameStackObservation(e, frame_stack)
    if max_episode_steps is not None:
        e = gym.wrappers.TimeLimit(e, max_episode_steps)
    return e


def make_atari_env(
    env: str = "ALE/Pong-v5",
    n_envs: int = 1,
    seed: int = 0,
    *,
    auto_reset: bool = True,
    info_keys: Sequence[str] = (),
    env_id_offset: int = 0,
    **preprocessing: Unpack[AtariPreprocessing],
) -> GymEnv | GymEnvInf:
    """``N`` preprocessed Atari envs as one VecEnv; a valid batcher ``create_env``.

    ``frame`` is ``(N, frame_stack, screen_size, screen_size)`` uint8, ``(N, 4, 84, 84)`` by
    default; actions are ``Discrete`` (the game's minimal action set).

    Args:
        env: an ALE id (``"ALE/Pong-v5"``...).
        n_envs: ``N``.
        seed: env ``k`` is reset with ``seed + k`` on its first reset.
        preprocessing: ``frame_skip``, ``frame_stack``, ``screen_size``, ``noop_max``,
            ``terminal_on_life_loss``, ``max_episode_steps``, ``repeat_action_probability``:
            the keyword arguments of :func:`make_atari_gym_env`, with its defaults.
        auto_reset: ``True``: :class:`~rlstruct.envs.GymEnvInf` (every env restarts, the TRUE
            final frame in ``obs_t1``); ``False``: :class:`~rlstruct.envs.GymEnv` (episodic).
        info_keys: numeric ``info`` entries recorded as ``info/<name>`` (e.g. ``"lives"``).
        env_id_offset: global index of env 0, used in error messages.

    Returns:
        The VecEnv (not yet reset).

    Raises:
        ImportError: ale-py or OpenCV is missing (``pip install -e '.[atari]'``).
        ConfigError: an unknown or non-ALE id, or a bad preprocessing argument.

    Example (needs ale-py)::

        env = make_atari_env("ALE/Pong-v5", n_envs=16, seed=0)
        obs, _ = env.reset()                           # obs["frame"]: (16, 4, 84, 84) uint8
        batcher = Batcher(128, make_agent, {}, make_atari_env, {"n_envs": 16}, n_processes=2)
    """
    try:
        options = inspect.signature(make_atari_gym_env).bind(env, **preprocessing)
    except TypeError as e:  # an unknown option: a TypeError, as for any keyword argument
        raise TypeError(f"make_atari_env() {e}") from None
    options.apply_defaults()
    o = options.arguments
    for name, low in (("frame_skip", 1), ("frame_stack", 1), ("screen_size", 8), ("noop_max", 0)):
        _check_int(name, o[name], low)
    if o["max_episode_steps"] is not None:
        _check_int("max_episode_steps", o["max_episode_steps"], 1)
    p = o["repeat_action_probability"]
    if p is not None and not 0.0 <= p <= 1.0:
        raise ConfigError(f"repeat_action_probability must be in [0, 1] or None, got {p!r}")
    register_atari_envs()
    _check_ale_id(env)
    factory = partial(make_atari_gym_env, env, **preprocessing)
    if isinstance(n_envs, bool) or not isinstance(n_envs, int) or n_envs < 1:
        raise ConfigError(f"n_envs must be an int >= 1, got {n_envs!r}")
    cls = GymEnvInf if auto_reset else GymEnv
    return cls([factory] * n_envs, seed=seed, info_keys=info_keys, env_id_offset=env_id_offset)


def _check_ale_id(env: str) -> None:
    """Raises ConfigError unless ``env`` is a gymnasium id of an ALE env."""
    if not isinstance(env, str):
        raise ConfigError(f"env must be an ALE id such as 'ALE/Pong-v5', got {env!r}")
    try:
        spec = gym.spec(env)
    except gym.error.Error as e:
        raise ConfigError(
            f"{env!r} is not a registered gymnasium id ({e}); ALE ids look like "
            "'ALE/Pong-v5' (ale-py registers them)"
        ) from None
    if "ale_py" not in str(spec.entry_point):
        raise ConfigError(
            f"{env!r} is not an ALE env (its entry point is {spec.entry_point!r}); "
            "make_atari_env preprocesses Atari games only"
        )


def _check_int(name: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{name} must be an int >= {low}, got {value!r}")
