"""rlstructures' names over rlstruct, so that porting code starts with one changed import.

::

    from rlstructures import RL_Agent, DictTensor           # becomes
    from rlstruct.compat import RL_Agent, DictTensor
    from rlstructures.rl_batchers import RL_Batcher          # becomes
    from rlstruct.compat import RL_Batcher

This layer only maps names and arguments; everything behaves as rlstruct does. The differences
that a port meets (gymnasium's ``terminated``/``truncated``, preserved dtypes, ``slice(a)`` keeping
the batch dimension, ``GymEnv`` taking env factories instead of env instances, typed errors
instead of assertions and hangs, ...) are listed in ``docs/migrating-from-rlstructures.md``.

- :class:`RL_Agent` is :class:`~rlstruct.Agent` with rlstructures' signatures:
  ``initial_state(agent_info, B)`` and ``__call__(state, input, agent_info=None, history=None)``.
- :class:`RL_Batcher` takes rlstructures' positional constructor arguments and drives a
  :class:`~rlstruct.Batcher` (CPU worker processes) when ``device`` is the CPU, or a
  :class:`~rlstruct.SerialBatcher` on ``device`` otherwise (rlstruct's workers are CPU-only: a GPU
  batcher is one process whose envs sit behind a :class:`~rlstruct.envs.DeviceEnv`).
- :data:`RL_Agent_CheckDevice` is :class:`~rlstruct.CheckDevice`.
- :func:`replay_agent` and :func:`replay_agent_stateless` accept rlstructures' keyword
  ``replay_method_name``.
- ``DictTensor``, ``TemporalDictTensor``, ``Trajectories``, ``masked_tensor``,
  ``masked_dicttensor``, ``VecEnv``, ``GymEnv``, ``GymEnvInf`` and ``DeviceEnv`` are rlstruct's
  own classes and functions, re-exported unchanged.
"""

from __future__ import annotations

import inspect
from typing import Any

from rlstruct.agent import Agent
from rlstruct.agent_replay import replay_agent as _replay_agent
from rlstruct.agent_replay import replay_agent_stateless as _replay_agent_stateless
from rlstruct.batchers import Batcher, SerialBatcher
from rlstruct.checks import CheckDevice
from rlstruct.devices import resolve_device
from rlstruct.dicttensor import DictTensor, masked_dicttensor, masked_tensor
from rlstruct.envs import DeviceEnv, GymEnv, GymEnvInf, VecEnv
from rlstruct.errors import ConfigError
from rlstruct.temporal import TemporalDictTensor
from rlstruct.trajectories import Trajectories

__all__ = [
    "RL_Agent",
    "RL_Batcher",
    "RL_Agent_CheckDevice",
    "replay_agent",
    "replay_agent_stateless",
    "DictTensor",
    "TemporalDictTensor",
    "Trajectories",
    "masked_tensor",
    "masked_dicttensor",
    "VecEnv",
    "GymEnv",
    "GymEnvInf",
    "DeviceEnv",
]


class RL_Agent(Agent):  # noqa: N801 - rlstructures' name
    """:class:`~rlstruct.Agent` under rlstructures' name and method signatures.

    Subclasses implement ``__call__(state, input, agent_info=None, history=None) -> (action,
    new_state)`` and, for recurrent agents, ``initial_state(agent_info, B)``; everything else
    (``update``, ``seed``, ``close``, ``call_replay``, ``to``) is :class:`~rlstruct.Agent`'s. The
    batchers always pass ``agent_info`` (a DictTensor on the CPU, possibly empty), so the
    ``None`` default only matters to direct calls. ``history`` and :meth:`require_history` live
    here only, for rlstructures' signature: no batcher passes a history (``history`` is always
    ``None``), and rlstruct's own :class:`~rlstruct.Agent` has neither.

    Two defaults differ from rlstructures': ``initial_state`` returns an empty state instead of
    raising, and ``update`` loads a ``state_dict`` into the agent's only ``nn.Module`` attribute
    instead of raising.
    """

    def initial_state(self, agent_info: DictTensor, B: int) -> DictTensor:  # noqa: N803
        """The state of ``B`` fresh rows (default: empty, a memoryless agent).

        Args:
            agent_info: DictTensor ``(B, ...)`` of per-row parameters (may be empty).
            B: number of rows.

        Returns:
            DictTensor ``(B, ...)``.
        """
        return super().initial_state(agent_info, B)

    def __call__(
        self,
        state: DictTensor,
        input: DictTensor,  # rlstructures' parameter name
        agent_info: DictTensor | None = None,
        history: Any = None,
    ) -> tuple[DictTensor, DictTensor]:
        """One step over ``B`` rows: returns ``(action, new_state)``.

        Args:
            state: DictTensor ``(B, ...)``, the agent state.
            input: DictTensor ``(B, ...)``, the observation (``frame``, ``initial_state``, ...).
            agent_info: DictTensor ``(B, ...)`` of per-row parameters.
            history: unused by the batchers (kept for rlstructures' signature).

        Returns:
            ``(action, new_state)``: DictTensors ``(B, ...)``; ``action`` holds ``"action"``.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement __call__")

    def require_history(self) -> bool:
        """rlstructures' question "does the agent need the trajectory so far?"; always False:
        the batchers never pass a ``history``."""
        return False


#: rlstructures' ``RL_Agent_CheckDevice(agent, device)``: rlstruct's :class:`~rlstruct.CheckDevice`,
#: which raises :class:`~rlstruct.errors.DeviceContractError` where rlstructures asserted.
RL_Agent_CheckDevice = CheckDevice


class RL_Batcher:  # noqa: N801 - rlstructures' name
    """rlstructures' ``RL_Batcher`` constructor over rlstruct's batchers.

    The arguments keep rlstructures' order, so positional calls port unchanged. On the CPU the
    batcher is a :class:`~rlstruct.Batcher` with ``n_processes`` worker processes. On any other
    device it is a :class:`~rlstruct.SerialBatcher` on that device: one process whose envs run on
    the CPU behind a :class:`~rlstruct.envs.DeviceEnv` (``create_env`` may also return a
    DeviceEnv itself, as rlstructures required), so ``n_processes`` must be 1 there (give the
    envs of all processes to ``env_args`` instead). The underlying batcher is :attr:`batcher`.

    rlstructures' order is ``Batcher``'s up to ``device``, so the signature is derived from
    ``Batcher``'s declaration: the same arguments, with no default for ``n_processes``,
    ``seeds``, ``agent_info`` and ``env_info``, then ``store_agent_state``.

    Args:
        n_timesteps: ``T``, the maximum number of steps of a segment.
        create_agent: ``create_agent(**agent_args) -> Agent``.
        agent_args: keyword arguments of ``create_agent``.
        create_env: ``create_env(**env_args, seed=s) -> VecEnv``; env ``k`` uses seed ``s + k``.
        env_args: keyword arguments of ``create_env`` (without ``seed``).
        n_processes: ``P``, the number of worker processes (1 on a non-CPU device).
        seeds: one seed per process, as in rlstructures (env ``k`` of process ``p`` gets
            ``seeds[p] + k``; overlapping ranges are refused), or one int run seed (rlstruct).
        agent_info: example DictTensor (1 or ``B`` rows) fixing the keys, shapes and dtypes of
            agent_info; also the default of ``reset``. ``DictTensor({})`` for none.
        env_info: the same for env_info (passed to the envs at reset).
        agent_seeds: one agent seed per process, or ``None`` (derived from ``seeds``).
        device: the batcher's device (rlstructures' default ``torch.device("cpu")``).
        store_agent_state: must stay False: rlstruct records the agent state at the start of
            every segment (``info["agent_state/*"]``), not at every step; ``replay_agent``
            recomputes the per-step states.

    Raises:
        ConfigError: ``n_processes != 1`` on a non-CPU device, an unavailable device,
            ``store_agent_state=True``, or any bad argument rlstruct's batchers refuse.
        TypeError: a factory cannot be sent to worker processes.
        WorkerError: a worker failed while starting.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Bound to rlstructures' signature (_rlstructures_signature), which help() and
        # inspect.signature show: a wrong call raises a TypeError like any Python call's.
        try:
            bound = _RL_BATCHER_SIGNATURE.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"RL_Batcher(): {e}") from None
        bound.apply_defaults()
        given = dict(bound.arguments)
        device = given.pop("device")
        if given.pop("store_agent_state"):
            raise ConfigError(
                "store_agent_state=True: rlstruct stores the agent state at the start of each "
                "segment in info['agent_state/*'] (not at every step); replay_agent recomputes "
                "the per-step states from it"
            )
        resolved = resolve_device(device)
        self.batcher: Batcher | SerialBatcher
        if resolved.type == "cpu":
            self.batcher = Batcher(**given)
            return
        n_processes = given.pop("n_processes")
        if n_processes != 1:
            raise ConfigError(
                f"RL_Batcher(device={device!r}, n_processes={n_processes!r}): a non-CPU batcher "
                "is one process (rlstruct's SerialBatcher with the envs behind a DeviceEnv); "
                "pass n_processes=1 and give all the envs to env_args, or collect on the CPU"
            )
        self.batcher = SerialBatcher(**given, device=resolved)

    def reset(
        self, agent_info: DictTensor | None = None, env_info: DictTensor | None = None
    ) -> None:
        """Resets every env (with ``env_info``) and every row's agent state and agent_info.

        Args:
            agent_info: DictTensor with 1 or ``B`` rows; default: the constructor's example.
            env_info: DictTensor with 1 or ``B`` rows; default: the constructor's example.
        """
        self.batcher.reset(agent_info, env_info)

    def execute(self, agent_info: DictTensor | None = None) -> None:
        """Starts collecting one segment (optionally with new per-row ``agent_info``)."""
        self.batcher.execute(agent_info)

    def get(self, blocking: bool = True) -> tuple[Trajectories | None, int | None]:
        """``(Trajectories, n_still_running)``, or ``(None, None)`` if not ``blocking`` and the
        segment is not ready."""
        return self.batcher.get(blocking)

    def update(self, info: Any) -> None:
        """Sends ``info`` (e.g. a ``state_dict``) to the batcher's agents."""
        self.batcher.update(info)

    def close(self) -> None:
        """Stops the workers and releases everything (idempotent)."""
        self.batcher.close()

    def n_elems(self) -> int:
        """``B``: the number of rows (envs) of a full batch."""
        return self.batcher.n_elems()

    def __enter__(self) -> RL_Batcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _rlstructures_signature() -> inspect.Signature:
    """``RL_Batcher.__init__``'s signature, as rlstructures had it: ``Batcher``'s arguments up to
    ``device``, in its order, of which ``n_processes``, ``seeds``, ``agent_info`` and ``env_info``
    have no default, then ``store_agent_state``."""
    required = {"n_processes", "seeds", "agent_info", "env_info"}
    params = [
        p.replace(default=inspect.Parameter.empty) if p.name in required else p
        for p in inspect.signature(Batcher.__init__).parameters.values()
        if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD and p.name != "self"
    ]
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    store = inspect.Parameter("store_agent_state", kind, default=False, annotation="bool")
    return inspect.Signature([*params, store], return_annotation="None")


_RL_BATCHER_SIGNATURE = _rlstructures_signature()
RL_Batcher.__init__.__signature__ = _RL_BATCHER_SIGNATURE.replace(  # type: ignore[attr-defined]
    parameters=[
        inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        *_RL_BATCHER_SIGNATURE.parameters.values(),
    ]
)


def replay_agent(
    agent: Agent, trajectories: Trajectories, replay_method_name: str = "call_replay"
) -> TemporalDictTensor:
    """:func:`rlstruct.replay_agent` with rlstructures' keyword ``replay_method_name``.

    Returns:
        TemporalDictTensor ``(B, T, *feat)`` of the agent's outputs at every step, with the
        trajectories' ``lengths``.
    """
    return _replay_agent(agent, trajectories, method=replay_method_name)


def replay_agent_stateless(
    agent: Agent, trajectories: Trajectories, replay_method_name: str = "call_replay"
) -> TemporalDictTensor:
    """:func:`rlstruct.replay_agent_stateless` with rlstructures' keyword ``replay_method_name``.

    Unlike rlstructures, which called ``getattr(agent, replay_method_name)(trajectories)``, the
    method has :meth:`~rlstruct.Agent.call_replay`'s signature ``(trajectories, t, state)`` and
    is called once on the ``B * T`` steps flattened into one-step trajectories.

    Returns:
        TemporalDictTensor ``(B, T, *feat)`` with the trajectories' ``lengths``.
    """
    return _replay_agent_stateless(agent, trajectories, method=replay_method_name)
