"""A trained policy from a run folder, in one line: ``rlstruct.load_policy(run_dir)``.

:func:`load_policy` rebuilds the evaluation agent that the run's checkpoint records (the
machinery of ``rlstruct evaluate``: :func:`~rlstruct.runs.checkpoint.rebuild_agent`), for every
algorithm and for learner-group runs alike, and wraps it in a :class:`Policy`, whose
:meth:`Policy.act` takes observations as the env returns them and gives actions as the env takes
them:

| observation space | one observation | a batch |
|---|---|---|
| ``Box`` of shape ``feat`` | ``(*feat)``: CartPole (4,), Atari (4, 84, 84) | ``(B, *feat)`` |
| ``Discrete`` | an int | ints ``(B,)`` |
| ``Dict`` / ``Tuple`` | a dict / tuple of the above | each leaf with a leading ``B`` |

| action space | one action | a batch |
|---|---|---|
| ``Discrete`` | a Python int | int64 ndarray ``(B,)`` |
| ``Box``, ``MultiDiscrete``... | ndarray ``(*feat)``, the space's dtype | ``(B, *feat)`` |

Action masks: a ``Dict`` observation with an ``action_mask`` leaf is honoured as it is; an env
that gives its mask in ``info`` passes it as ``policy.act(obs, action_mask=info["action_mask"])``
(``(A,)`` for one observation, ``(B, A)`` for a batch; nonzero: legal). Greedy and sampled
actions are then legal ones (:mod:`rlstruct.blocks.masks`).

Actions are greedy by default (the action evaluation plays); ``deterministic=False`` samples
from the policy (DQN: epsilon-greedy with the run's final ``eps_end``), from a generator of the
policy's own (``seed``). Lists, torch tensors and arrays of another dtype are accepted where
``torch.can_cast`` allows it (float64 or ints for a float32 Box; never floats for uint8 frames).

A recurrent policy (``rlstruct train a2c --model mlp-gru``) keeps its memory between calls, one
row per observation of the batch: call :meth:`Policy.reset` when an episode starts again. Each
thread that calls :meth:`Policy.act` has a memory of its own, so threads sharing one policy play
their episodes as if each had the policy alone; :meth:`Policy.session` gives a memory of its own
to each of several episodes played in one thread (``session.act(obs)``, ``session.reset()``).

Observations are checked before the model sees them: a shape that is neither the space's nor a
batch of it, ragged rows or a value that is not an array of numbers raise
:class:`~rlstruct.errors.ShapeError` or :class:`~rlstruct.errors.SpaceError`, NaN or an infinity
:class:`~rlstruct.errors.NonFiniteError`, each naming the observation key and what was expected.

Example::

    policy = rlstruct.load_policy("runs/ppo_CartPole-v1_20261125-101500")
    obs, _ = env.reset()
    action = policy.act(obs)   # env.step(action); policy.act(obs, deterministic=False) samples
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor

from rlstruct import keys as K
from rlstruct.agent import Agent
from rlstruct.batchers.rows import broadcast_rows
from rlstruct.blocks.sampling import GREEDY
from rlstruct.devices import resolve_device
from rlstruct.dicttensor import DictTensor
from rlstruct.envs.masks import check_masks
from rlstruct.envs.registry import env_factory, import_env_modules
from rlstruct.envs.spaces import (
    MISSING,
    ActionSpec,
    Leaf,
    leaf_value,
    observation_leaves,
    torch_dtype,
)
from rlstruct.errors import CheckpointError, ConfigError, NonFiniteError, ShapeError, SpaceError
from rlstruct.runs.checkpoint import load_checkpoint, rebuild_agent, recorded_env
from rlstruct.runs.folder import RunFolder, is_run_dir

__all__ = ["Policy", "PolicySession", "load_policy"]


def load_policy(
    run_dir: str | Path,
    checkpoint: str = "latest",
    device: str | torch.device = "cpu",
    seed: int | None = None,
) -> Policy:
    """The policy saved in the run folder ``run_dir``, ready to act.

    Args:
        run_dir: a run folder (what ``rlstruct train`` printed after ``outputs in``).
        checkpoint: ``"latest"`` or ``"best"`` (``checkpoints/<checkpoint>.pt``).
        device: where the policy's model runs (``"cpu"``, ``"cuda:0"``, ``"auto"``...).
        seed: seeds the draws of ``act(obs, deterministic=False)`` (default: one drawn from
            torch's global generator).

    Returns:
        A :class:`Policy` on ``device``.

    Raises:
        CheckpointError: ``run_dir`` is not a run folder, holds no such checkpoint, or the
            checkpoint does not record how to rebuild the policy or its env (``env_id``).
        ConfigError: a bad ``checkpoint`` or ``device`` (a device this machine lacks), or the
            run's env raised in ``close()``.
    """
    if checkpoint not in ("latest", "best"):
        raise ConfigError(f"checkpoint must be 'latest' or 'best', got {checkpoint!r}")
    run_dir = Path(run_dir)
    folder = RunFolder(run_dir).checkpoints
    if not run_dir.is_dir() or not (is_run_dir(run_dir) or folder.is_dir()):
        raise CheckpointError(
            f"{run_dir} is not a run folder (no config.json, progress.csv nor checkpoints/ in "
            "it); pass the folder that training printed after 'outputs in'")
    path = RunFolder(run_dir).checkpoint(checkpoint)
    if not path.is_file():
        saved = sorted(p.name for p in folder.glob("*.pt")) if folder.is_dir() else []
        raise CheckpointError(
            f"the run {run_dir} has no checkpoint {path.name} (it holds {saved or 'none'}); a "
            "run writes checkpoints/latest.pt every checkpoint_every iterations and at its end")
    device = resolve_device(device)
    state = load_checkpoint(path)
    create_agent, agent_args, greedy = rebuild_agent(state, path)
    cfg = state.get("config") or {}
    env_id, backend, modules = recorded_env(state, path)
    import_env_modules(modules)
    env = env_factory(env_id, backend)()
    observation_space, action_space = env.observation_space, env.action_space
    try:
        env.close()
    except Exception as err:  # reported as the env's close error
        raise ConfigError(f"the run's env {env_id!r} was made, but its close() raised "
                          f"{type(err).__name__}: {err}") from err
    return Policy(create_agent(**agent_args), observation_space, action_space, greedy_info=greedy,
                  sample_info=_sample_info(greedy, cfg), device=device, seed=seed,
                  checkpoint=state)


def _sample_info(greedy: DictTensor | None, cfg: Mapping[str, Any]) -> DictTensor | None:
    """The ``agent_info`` that samples: the greedy one without ``greedy``; an ``epsilon``
    (DQN's, 0 when greedy) set to the run's final exploration rate ``eps_end``."""
    if greedy is None:
        return None
    kept = {k: v for k, v in greedy.items() if k != GREEDY}
    if "epsilon" in kept:
        kept["epsilon"] = torch.full_like(kept["epsilon"], float(cfg.get("eps_end", 0.05)))
    return DictTensor(kept) if kept else None


class Policy:
    """An agent that acts on observations as a gymnasium env returns them (see the module
    docstring for the formats); built by :func:`load_policy`.

    Args:
        agent: the agent (an :class:`~rlstruct.agent.Agent` reading ``observation["frame"]``
            or the space's leaf keys).
        observation_space: the env's observation space.
        action_space: the env's action space.
        greedy_info: the ``agent_info`` ``(1, ...)`` of greedy actions (``{"greedy": True}``).
        sample_info: the ``agent_info`` ``(1, ...)`` of sampled actions (None: empty).
        device: where the agent runs.
        seed: seeds the agent's draws (default: one drawn from torch's global generator).
        checkpoint: the checkpoint the agent comes from (kept as :attr:`checkpoint`).

    Attributes:
        observation_space: the env's observation space.
        action_space: the env's action space.
        device: where the agent runs.
        recurrent: the agent carries a state between calls (reset it with :meth:`reset`); each
            thread has its own (:meth:`session`: one more of them).
        checkpoint: the checkpoint it was loaded from (``algo``, ``config``, ``frames``...),
            ``{}`` when built from an agent.
    """

    def __init__(
        self,
        agent: Agent,
        observation_space: gym.Space,
        action_space: gym.Space,
        greedy_info: DictTensor | None = None,
        sample_info: DictTensor | None = None,
        device: str | torch.device = "cpu",
        seed: int | None = None,
        checkpoint: Mapping[str, Any] | None = None,
    ) -> None:
        self.observation_space, self.action_space = observation_space, action_space
        self.device = resolve_device(device)
        self.checkpoint = dict(checkpoint or {})
        self._leaves: list[Leaf] = observation_leaves(observation_space)
        self._actions = ActionSpec(action_space)
        self._infos = {True: greedy_info, False: sample_info}
        self.agent = agent.to(self.device)
        for module in agent.modules().values():
            module.eval()
        agent.seed(int(torch.randint(2**31 - 1, ())) if seed is None else seed)
        self.recurrent = not agent.initial_state(DictTensor(batch_size=1), 1).empty()
        self._lock = threading.Lock()  # one agent call at a time: the agent is shared
        self._threads = threading.local()  # each thread's own session (its memory)

    def __repr__(self) -> str:
        algo, frames = self.checkpoint.get("algo", "?"), self.checkpoint.get("frames")
        trained = f", {frames:,} frames" if frames is not None else ""
        return (f"Policy({algo}{trained}, {type(self.agent).__name__} on {self.device}, "
                f"observations {self.observation_space}, actions {self.action_space})")

    def session(self) -> PolicySession:
        """A memory of its own for one more stream of episodes: ``session.act(obs)`` acts as
        :meth:`act` does, with a recurrent memory that no other session and no thread's
        :meth:`act` touches (e.g. several episodes interleaved in one thread). A feed-forward
        policy's sessions are all alike."""
        return PolicySession(self)

    def _own(self) -> PolicySession:
        """The calling thread's session (made at its first call)."""
        own = getattr(self._threads, "session", None)
        if own is None:
            own = self._threads.session = PolicySession(self)
        return own

    @property
    def memory(self) -> DictTensor | None:
        """The calling thread's recurrent memory of the episodes it acts in (None before its
        first :meth:`act` and after :meth:`reset`)."""
        return self._own().memory

    def reset(self) -> None:
        """Forgets the calling thread's recurrent memory: its next :meth:`act` starts fresh
        episodes (other threads' and sessions' memories are kept)."""
        self._own().reset()

    def act(self, obs: Any, deterministic: bool = True, action_mask: Any = None) -> Any:
        """The action for one observation ``(*feat)``, or the actions of a batch ``(B, *feat)``,
        with the calling thread's memory (a recurrent policy; see :meth:`session`).

        Args:
            obs: one observation as the env returns it (an ndarray ``(*feat)`` of a Box, an int
                of a Discrete space...), or a batch of them ``(B, *feat)`` (see the module
                docstring; a Dict space: a dict of these).
            deterministic: the greedy action (True) or one sampled from the policy (False).
            action_mask: the legal actions of a ``Discrete`` action space (what an env gives
                as ``info["action_mask"]``): ``(A,)`` for one observation, ``(B, A)`` for a
                batch, bools or 0/1 numbers; None: all legal (or the observation's own
                ``action_mask`` leaf).

        Returns:
            One action as the env takes it (a Python int for ``Discrete``, an ndarray of the
            space's shape and dtype for a Box...), or an ndarray ``(B, *action feat)``.

        Raises:
            ShapeError: ``obs`` has neither the space's shape nor a batch of it (the message
                names the shape expected), its rows are ragged, or a recurrent policy gets
                another number of rows than its memory holds (call :meth:`reset`).
            SpaceError: ``obs`` is not numbers, or has a dtype that does not cast to the
                space's without loss.
            NonFiniteError: a float observation holds NaN or an infinity.
            ActionMaskError: a row of ``action_mask`` allows no action.
        """
        return self._own().act(obs, deterministic, action_mask)

    @torch.no_grad()
    def _step(self, memory: PolicySession, obs: Any, deterministic: bool,
              action_mask: Any = None) -> Any:
        """:meth:`act` with ``memory``'s recurrent state (updated in place)."""
        frames, n, single = self._rows(obs)
        if action_mask is not None:
            frames[K.ACTION_MASK] = self._mask_rows(action_mask, n, single)
        agent_info = broadcast_rows(self._infos[bool(deterministic)], n, "agent_info")
        state, fresh = self._begin(memory, agent_info, n)
        last = memory.last_action if memory.last_action is not None else torch.as_tensor(
            self._actions.default).expand(n, *self._actions.shape)
        observation = DictTensor({
            **frames,
            K.REWARD: torch.zeros(n), K.TERMINATED: torch.zeros(n, dtype=torch.bool),
            K.TRUNCATED: torch.zeros(n, dtype=torch.bool), K.DONE: torch.zeros(n, dtype=torch.bool),
            K.INITIAL_STATE: torch.full((n,), fresh), K.LAST_ACTION: last.clone(),
            K.ENV_STEP: torch.zeros(n, dtype=torch.long),
        }).to(self.device)
        with self._lock:
            step, new_state = self.agent(state, observation, agent_info)
        action = step[K.ACTION_KEY].cpu()
        if self.recurrent:
            memory.state, memory.last_action = new_state, action
        out = self._actions.to_numpy(action, np.arange(n), 0)
        if not single:
            return out
        return int(out[0]) if isinstance(self.action_space, gym.spaces.Discrete) else out[0]

    def _begin(self, memory: PolicySession, agent_info: DictTensor,
               n: int) -> tuple[DictTensor, bool]:
        """``(state, fresh)``: the carried state of a recurrent policy, else a fresh one."""
        if memory.state is None or not self.recurrent:
            return self.agent.initial_state(agent_info, n).to(self.device), True
        if memory.state.n_elems() != n:
            raise ShapeError(
                f"this recurrent policy remembers {memory.state.n_elems()} episode(s) and got "
                f"{n} observation(s); call policy.reset() before acting on another batch")
        return memory.state, False

    def _rows(self, obs: Any) -> tuple[dict[str, Tensor], int, bool]:
        """``({key: (n, *leaf shape)}, n, single)``: the observation's leaves as rows on the
        CPU, and whether it was one observation (``n = 1``) rather than a batch."""
        out: dict[str, Tensor] = {}
        rows: tuple[int, bool] | None = None
        for leaf in self._leaves:
            value = leaf_value(obs, leaf)
            if value is MISSING:
                raise ShapeError(f"the observation has no {leaf.key!r} (path {list(leaf.path)}), "
                                 f"which the observation space {self.observation_space} holds")
            tensor = self._leaf_tensor(value, leaf)
            mine = (1, True) if tuple(tensor.shape) == leaf.shape else (tensor.shape[0], False)
            if rows is not None and mine != rows:
                first = next(iter(out))
                raise ShapeError(
                    f"observation key {leaf.key!r} has shape {tuple(tensor.shape)}, but key "
                    f"{first!r} has shape {tuple(out[first].shape)}: a batch has the same rows "
                    "in every key")
            rows = mine
            out[leaf.key] = tensor.reshape(-1, *leaf.shape)
        assert rows is not None  # a space has at least one leaf
        return out, rows[0], rows[1]

    def _mask_rows(self, action_mask: Any, n: int, single: bool) -> Tensor:
        """``action_mask`` as bool rows ``(n, A)``, checked."""
        space = self.action_space
        if not isinstance(space, gym.spaces.Discrete):
            raise SpaceError(f"action_mask restricts a Discrete action space; this policy's is "
                             f"{space}")
        try:
            mask = torch.as_tensor(np.asarray(action_mask)).bool()
        except (TypeError, ValueError) as err:
            raise ShapeError(f"action_mask is not an array of numbers: {err}") from None
        shape = (int(space.n),) if single else (n, int(space.n))
        if tuple(mask.shape) != shape:
            raise ShapeError(f"action_mask has shape {tuple(mask.shape)}, expected {shape} (one "
                             f"entry per action{'' if single else ', a row per observation'})")
        mask = mask.reshape(n, -1)
        check_masks(mask.numpy(), np.arange(n), np.ones(n, bool), 0, np.zeros(n, np.int64))
        return mask

    def _leaf_tensor(self, value: Any, leaf: Leaf) -> Tensor:
        """``value`` (one observation or a batch of one leaf) as a CPU tensor of the leaf's
        dtype."""
        is_tensor = isinstance(value, Tensor)
        key = "" if leaf.key == K.FRAME else f" key {leaf.key!r}"
        try:
            array = value.detach().cpu() if is_tensor else np.asarray(value)
        except (ValueError, TypeError) as err:  # ragged rows, or no array at all
            raise ShapeError(
                f"observation{key} is not an array of one shape ({type(err).__name__}: {err}); "
                f"expected {leaf.shape} (one observation) or (B, *{leaf.shape}) (a batch of "
                f"rows of that shape) from the observation space {leaf.space}") from None
        if not is_tensor and array.dtype.kind not in "biufc":  # numbers (complex: refused below)
            raise SpaceError(
                f"observation{key} is {type(value).__name__} {_short(value)} (numpy dtype "
                f"{array.dtype}), expected numbers of dtype {leaf.dtype}, shape {leaf.shape} "
                f"(one observation) or (B, *{leaf.shape}) (a batch), from the observation "
                f"space {leaf.space}")
        shape = tuple(array.shape)
        if shape != leaf.shape and (len(shape) != len(leaf.shape) + 1 or shape[1:] != leaf.shape):
            key = "" if leaf.key == K.FRAME else f" key {leaf.key!r}"
            raise ShapeError(
                f"observation{key} has shape {shape}, expected {leaf.shape} (one observation) or "
                f"(B, *{leaf.shape}) (a batch) from the observation space {leaf.space}")
        target = torch_dtype(leaf.dtype)
        source = array.dtype if is_tensor else torch_dtype(array.dtype)
        if source != target and not torch.can_cast(source, target):
            raise SpaceError(
                f"observation has dtype {array.dtype}, expected {leaf.dtype} from the observation "
                f"space {leaf.space} (or a dtype that casts to it without loss)")
        tensor = torch.as_tensor(array).to(target)
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            bad = tensor[~torch.isfinite(tensor)][0].item()
            raise NonFiniteError(
                f"observation{key} holds {bad} ({int((~torch.isfinite(tensor)).sum())} "
                f"non-finite value(s)); the policy acts on finite observations of the space "
                f"{leaf.space}")
        return tensor


class PolicySession:
    """One stream of episodes of a :class:`Policy`, with a recurrent memory of its own
    (:meth:`Policy.session`); it acts with the policy's agent and formats.

    Args:
        policy: the policy it acts with.
    """

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.state: DictTensor | None = None
        self.last_action: Tensor | None = None

    @property
    def memory(self) -> DictTensor | None:
        """The recurrent memory (None before the first :meth:`act` and after :meth:`reset`)."""
        return self.state

    def reset(self) -> None:
        """Forgets the memory: the next :meth:`act` starts fresh episodes."""
        self.state = self.last_action = None

    def act(self, obs: Any, deterministic: bool = True, action_mask: Any = None) -> Any:
        """:meth:`Policy.act` with this session's memory (same arguments, results, errors)."""
        return self.policy._step(self, obs, deterministic, action_mask)


def _short(value: Any, n: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= n else text[:n - 3] + "..."
