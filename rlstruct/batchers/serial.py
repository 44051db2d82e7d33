"""``SerialBatcher``: the acquisition loop in the calling process, on any device.

It is the reference implementation (``Batcher`` must return exactly what it returns for the same
seeds) and, with a GPU ``device``, the single-process GPU batcher: the envs run on the CPU behind
a :class:`~rlstruct.envs.DeviceEnv`, the agent's copy of the model and the slot buffer live on the
device, and one process steps many envs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from rlstruct.agent import Agent
from rlstruct.batchers.base import BatcherBase, Phase, serialized
from rlstruct.batchers.buffer import SlotBuffer
from rlstruct.batchers.rollout import Rollout, infer_specs
from rlstruct.batchers.rows import broadcast_rows
from rlstruct.batchers.seeding import RNGStreams, env_seed_bases, isolated_rngs
from rlstruct.dicttensor import DeviceLike, DictTensor, _same_device
from rlstruct.envs.base import VecEnv
from rlstruct.errors import ConfigError
from rlstruct.parallel.transport import cpu_copy, cpu_tensors_copy
from rlstruct.parallel.weights import check_finite as check_finite_weights
from rlstruct.parallel.weights import is_state_dict
from rlstruct.trajectories import Trajectories

__all__ = ["SerialBatcher", "make_env_on"]


def make_env_on(
    create_env: Callable[..., VecEnv],
    env_args: Mapping[str, Any],
    seed: int,
    device: torch.device,
    env_id_offset: int = 0,
) -> VecEnv:
    """Builds the VecEnv and, when it lives on another device than ``device`` (its ``device``:
    the CPU for gymnasium envs), wraps it in a DeviceEnv. A torch-native env built on the
    batcher's device is used as it is: no copy to or from the host.

    Args:
        create_env: ``create_env(**env_args, seed=seed) -> VecEnv``.
        env_args: its keyword arguments.
        seed: the seed of env 0.
        device: the batcher's device.
        env_id_offset: the GLOBAL index of env 0 (worker ``w`` of ``n`` envs each: ``w * n``),
            given to the env with :meth:`VecEnv.set_env_id_offset` so that its error messages
            name global env indices, whatever ``create_env`` passed.

    Returns:
        The VecEnv, on ``device``.

    Raises:
        ConfigError: ``create_env`` returned something else than a VecEnv.
    """
    env = create_env(**env_args, seed=seed)
    if not isinstance(env, VecEnv):
        raise ConfigError(f"create_env returned a {type(env).__name__}, expected a VecEnv")
    env.set_env_id_offset(env_id_offset)
    from rlstruct.envs.device import DeviceEnv

    if not isinstance(env, DeviceEnv) and not _same_device(env.device, device):
        env = DeviceEnv(env, env.device, device)
    return env


class SerialBatcher(BatcherBase):
    """Collects trajectories in the calling process (see :class:`~rlstruct.Batcher` for the API).

    Args:
        n_timesteps: ``T``, the maximum number of steps of a segment.
        create_agent: ``create_agent(**agent_args) -> Agent``; built on the CPU then moved to
            ``device`` (so a model that lives on cuda:0 is copied to cuda:k via the CPU).
        agent_args: keyword arguments of ``create_agent``.
        create_env: ``create_env(**env_args, seed=s) -> VecEnv``; env ``k`` uses seed ``s + k``.
        env_args: keyword arguments of ``create_env`` (no ``seed``).
        seeds: the run seed (env ``g`` gets ``seeds * 2**20 + g``) or ``[s]`` (env ``k`` gets
            ``s + k``, rlstructures-style). This and every later argument are keyword-only, so
            that swapping SerialBatcher and Batcher never shifts a positional argument.
        agent_info: example DictTensor (1 or B rows) fixing the keys, shapes and dtypes of
            agent_info; also the default at ``reset``.
        env_info: same for env_info (passed to the envs at reset).
        agent_seeds: the agent's seed (``[s]``); derived from ``seeds`` when None.
        device: where the agent, the buffer and the returned trajectories live.

    Random numbers: the batcher owns random streams (torch's CPU generator, the device's CUDA
    generator, numpy's and ``random``'s global generators) seeded with the agent seed, and
    swaps them in around everything it runs (building the env and the agent, ``reset``,
    ``execute``, ``update``). An agent that samples from the global generators, or a model
    initialised in ``create_agent``, is therefore reproducible, the caller's streams are not
    consumed, and the data equal a one-process ``Batcher``'s with the same seeds.
    """

    def __init__(
        self, n_timesteps: int, create_agent: Callable[..., Agent],
        agent_args: Mapping[str, Any] | None, create_env: Callable[..., VecEnv],
        env_args: Mapping[str, Any] | None, *,
        seeds: int | Sequence[int] = 0,
        agent_info: DictTensor | None = None,
        env_info: DictTensor | None = None,
        agent_seeds: Sequence[int] | None = None,
        device: DeviceLike = "cpu",
    ) -> None:
        problems = self._validate_common(
            n_timesteps,
            create_agent,
            agent_args,
            create_env,
            env_args,
            seeds,
            agent_info,
            env_info,
        )
        if agent_seeds is not None and len(agent_seeds) != 1:
            problems.append(f"agent_seeds must hold one seed, got {list(agent_seeds)}")
        self._raise_problems(problems)
        self._device = torch.device(device)
        agent_args, env_args = dict(agent_args or {}), dict(env_args or {})
        self.n_timesteps = n_timesteps

        # A throwaway env and agent learn the specs, under saved-and-restored generators: the
        # caller's random streams are not consumed, and the real agent starts untouched (its RNG
        # and any counters), exactly like a Batcher worker's agent.
        with isolated_rngs(self._device):
            probe = make_env_on(create_env, env_args, 0, self._device)
            try:
                n = probe.n_envs()
                env_bases, default_agent_seeds = env_seed_bases(seeds, 1, n)
                self._n_rows = n
                self._agent_info = broadcast_rows(agent_info, n, "agent_info")
                self._env_info = broadcast_rows(env_info, n, "env_info")
                agent_args = cpu_copy(agent_args)
                probe_agent = create_agent(**agent_args).to(self._device)
                step_specs, info_specs = infer_specs(
                    probe, probe_agent, self._agent_info, self._env_info
                )
                probe_agent.close()
            finally:
                probe.close()
        self._agent_info_specs = self._agent_info.specs()
        self._env_info_specs = self._env_info.specs()
        agent_seed = (agent_seeds or default_agent_seeds)[0]
        # Everything this batcher runs (building, reset, steps, update) draws from streams of
        # its own, seeded like a one-process Batcher's worker: same seeds, same data.
        with RNGStreams(agent_seed, self._device).active():
            self.env = make_env_on(create_env, env_args, env_bases[0], self._device)
            try:
                self.agent = create_agent(**agent_args).to(self._device)
                self.agent.seed(agent_seed)
            except BaseException:
                self.env.close()
                raise
        self._rngs = RNGStreams(agent_seed, self._device)
        self.buffer = SlotBuffer(n, n_timesteps, step_specs, info_specs, self._device)
        self._rollout = Rollout(self.env, self.agent, self.buffer, offset=0)
        self._n_running: int | None = None
        self._phase = Phase.NEW

    @serialized
    def reset(
        self, agent_info: DictTensor | None = None, env_info: DictTensor | None = None
    ) -> None:
        """Resets every env (with ``env_info``) and every row's agent state and agent_info.

        Args:
            agent_info: DictTensor (1 or B rows); default: the constructor's example.
            env_info: DictTensor (1 or B rows); default: the constructor's example.
        """
        self._require("reset", Phase.NEW, Phase.READY)
        ai = self._rows_info(agent_info, self._agent_info, self._agent_info_specs, "agent_info")
        ei = self._rows_info(env_info, self._env_info, self._env_info_specs, "env_info")
        with self._rngs.active():
            self._rollout.reset(ai, ei)
        self._n_running = self._rollout.n_running
        self._phase = Phase.READY

    @serialized
    def execute(self, agent_info: DictTensor | None = None) -> None:
        """Collects one segment of at most ``n_timesteps`` steps (synchronously).

        Args:
            agent_info: new per-row agent_info (1 or B rows) used from now on by running rows.
        """
        ai = self._begin_execute(agent_info)
        if ai is not None:
            self._rollout.set_agent_info(ai)
        self._phase = Phase.RUNNING
        try:
            with self._rngs.active():
                self._n_running = self._rollout.run(self.n_timesteps)
        except BaseException:
            self._phase = Phase.READY
            raise

    @serialized
    def get(
        self, blocking: bool = True, device: DeviceLike | None = None
    ) -> tuple[Trajectories | None, int | None]:
        """The segment of the last ``execute``: ``(Trajectories, n_still_running)``.

        Rows whose env was not running at the segment start are left out; ``T`` is the longest
        row's length. The batch is a copy (it never aliases the buffer).

        Args:
            blocking: ignored (``execute`` already collected the segment).
            device: where the batch should live (default: the batcher's device).
        """
        self._require("get", Phase.RUNNING)
        self._phase = Phase.READY
        target = None if device is None else torch.device(device)
        return self.buffer.read(device=target), self._n_running

    @serialized
    def update(self, info: Any, check_finite: bool = True) -> None:
        """Passes ``info`` (e.g. a ``state_dict``) to the agent's ``update``; tensors are
        copied via the CPU so that nothing new is allocated on another GPU. Safe from any
        thread (calls take turns, see ``Batcher.update``).

        Args:
            info: a state_dict, or anything the agent's ``update`` takes.
            check_finite: refuse a state_dict holding NaN or an infinity (False skips it).

        Raises:
            NonFiniteError: a state_dict with NaN or an infinity (the keys named).
        """
        self._require("update", Phase.NEW, Phase.READY, Phase.RUNNING)
        weights = is_state_dict(info)
        if check_finite and weights:
            check_finite_weights(info)
        info = cpu_tensors_copy(info) if weights else cpu_copy(info)
        if type(self.agent).update is Agent.update:  # load_state_dict: no random draw, so no
            self.agent.update(info)  # swap of the streams (about 0.3 ms: numpy's state)
        else:
            with self._rngs.active():
                self.agent.update(info)
        self._rollout.version += 1

    @property
    def version(self) -> int:
        """How many times ``update`` was called."""
        return self._rollout.version

    def close(self) -> None:
        """Closes the envs and the agent (idempotent)."""
        if self._phase is Phase.CLOSED:
            return
        self._phase = Phase.CLOSED
        self.env.close()
        self.agent.close()
