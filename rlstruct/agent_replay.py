"""Re-running an agent over stored trajectories, with gradients, to compute losses.

- :func:`replay_agent` steps through time ``t = 0 .. T-1`` and carries the agent's state. It starts
  from the state stored in ``info["agent_state/*"]`` (so a recurrent agent continues across
  consecutive segments), or from ``agent.initial_state`` when none is stored.
- :func:`replay_agent_stateless` makes ONE batched call over all ``B * T`` steps: the fast path
  for memoryless agents. It also takes transitions directly: a DictTensor ``(N, *feat)`` of
  trajectory keys, such as ``TemporalDictTensor.to_transitions()`` or a
  :class:`~rlstruct.blocks.replay_buffer.ReplayBuffer` sample, and returns a DictTensor ``(N,
  *feat)``.

Both run on the trajectories' device, keep the autograd graph (no ``torch.no_grad``) and return a
TemporalDictTensor ``(B, T, *feat)`` with the trajectories' ``T`` and ``lengths``, so that its
tensors line up with ``trajectories.trajectories``. Steps at ``t >= lengths[b]`` are padding: the
agent runs on them too (its outputs there are meaningless), and the result's ``lengths`` and
``mask()`` hide them; mask every loss. To skip the steps where every row is padding, shorten
first: ``Trajectories(info, trajectories.trajectories.shorten())``.

During replay the agent receives ``agent_info`` on the trajectories' device (it comes from
``trajectories.info``), not on the CPU as during acquisition.

Examples:
    >>> import torch
    >>> from rlstruct.agent import Agent
    >>> class Double(Agent):  # memoryless: action = 2 * x
    ...     def __call__(self, state, observation, agent_info):
    ...         return DictTensor({"action": observation["x"] * 2}), state
    >>> steps = TemporalDictTensor({"observation/x": torch.arange(6).view(2, 3)},
    ...                            torch.tensor([3, 2]))
    >>> traj = Trajectories(DictTensor(), steps)
    >>> replay_agent(Double(), traj)["action"]
    tensor([[ 0,  2,  4],
            [ 6,  8, 10]])
    >>> replay_agent_stateless(Double(), traj).equal(replay_agent(Double(), traj))
    True
    >>> replay_agent_stateless(Double(), steps.to_transitions())["action"]  # the 5 valid steps
    tensor([0, 2, 4, 6, 8])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, overload

import torch

from rlstruct import keys as K
from rlstruct.dicttensor import DictTensor, _same_device
from rlstruct.errors import DeviceContractError, ShapeError
from rlstruct.temporal import TemporalDictTensor
from rlstruct.trajectories import Trajectories

if TYPE_CHECKING:
    from rlstruct.agent import Agent

__all__ = ["replay_agent", "replay_agent_stateless"]

ReplayMethod = Callable[[Trajectories, int, DictTensor], tuple[DictTensor, DictTensor]]


def replay_agent(
    agent: Agent, trajectories: Trajectories, method: str = "call_replay"
) -> TemporalDictTensor:
    """Re-runs ``agent`` step by step over ``trajectories``, with gradients.

    For ``t = 0 .. T-1``: ``output, state = getattr(agent, method)(trajectories, t, state)``.
    The first ``state`` is ``trajectories.info.truncate_key("agent_state/")`` when the info holds
    an agent state (the state at the segment start), else
    ``agent.initial_state(agent_info, B)``. The agent resets its state itself where
    ``observation["initial_state"]`` is true, exactly as during acquisition.

    Args:
        agent: the agent (or a :class:`~rlstruct.checks.CheckDevice` around it), on the
            trajectories' device.
        trajectories: Trajectories with ``info`` ``(B, ...)`` and steps ``(B, T, *feat)``.
        method: name of the agent method called at each step, with the signature of
            :meth:`Agent.call_replay` ``(trajectories, t, state) -> (output, new_state)``.

    Returns:
        TemporalDictTensor ``(B, T, *feat)``: the outputs of every step stacked in time, with the
        trajectories' ``lengths``, on the trajectories' device. If ``T == 0`` it has no key.

    Raises:
        AttributeError: the agent has no method ``method``.
        ShapeError: an output or new state has other than ``B`` rows (names ``t`` and the key).
        DeviceContractError: the outputs are not on the trajectories' device.
    """
    fn = _replay_method(agent, method)
    steps = trajectories.trajectories
    b, n_t = steps.n_elems(), steps.n_timesteps()
    state = trajectories.info.truncate_key(K.AGENT_STATE)
    if state.empty():
        state = agent.initial_state(_agent_info(trajectories.info, b), b)
    outputs = []
    for t in range(n_t):
        out, state = _check_result(fn(trajectories, t, state), method, b, f"t={t}")
        outputs.append(out)
    if not outputs:
        return TemporalDictTensor.trusted(DictTensor(batch_size=b), steps.lengths, n_t)
    return _as_temporal(DictTensor.stack(outputs, dim=1), steps, method)


@overload
def replay_agent_stateless(
    agent: Agent, trajectories: Trajectories, method: str = ...
) -> TemporalDictTensor: ...
@overload
def replay_agent_stateless(
    agent: Agent, trajectories: DictTensor, method: str = ...
) -> DictTensor: ...
def replay_agent_stateless(
    agent: Agent, trajectories: Trajectories | DictTensor, method: str = "call_replay"
) -> TemporalDictTensor | DictTensor:
    """Re-runs a memoryless ``agent`` over every step of ``trajectories`` in ONE batched call.

    The ``(B, T)`` steps are flattened into ``B * T`` trajectories of one step each (row
    ``b * T + t`` is step ``t`` of row ``b``; its ``lengths`` is 1 on valid steps, 0 on padding),
    ``info`` is repeated per step (``agent_state/*`` dropped), and the agent is called once:
    ``output, _ = getattr(agent, method)(flat, 0, empty_state)``. The method has the signature
    of :meth:`Agent.call_replay`, so the default ``call_replay`` calls ``agent(state,
    observation (B*T, *feat), agent_info (B*T, ...))`` and a custom replay method serves both
    replay functions. ``empty_state`` is an empty DictTensor with ``B*T`` rows; the returned
    new state is ignored. Use :func:`replay_agent` for recurrent agents.

    Transitions (a DictTensor ``(N, *feat)`` of trajectory keys, every row a valid step) are
    replayed the same way, as ``N`` trajectories of one step with an empty ``info``; the outputs
    come back as a DictTensor ``(N, *feat)``.

    Args:
        agent: a memoryless agent, on the trajectories' device.
        trajectories: Trajectories with ``info`` ``(B, ...)`` and steps ``(B, T, *feat)``, or
            transitions ``(N, *feat)``.
        method: name of the agent method to call (see above).

    Returns:
        For Trajectories, a TemporalDictTensor ``(B, T, *feat)`` with the trajectories'
        ``lengths``, equal to what :func:`replay_agent` returns for a memoryless agent; for
        transitions, a DictTensor ``(N, *feat)``. If there is no step the agent is not called
        and the result has no key.

    Raises:
        AttributeError: the agent has no method ``method``.
        ShapeError: an output has other than ``B * T`` rows (names the key).
        DeviceContractError: the outputs are not on the trajectories' device.
    """
    fn = _replay_method(agent, method)
    if isinstance(trajectories, DictTensor):
        return _replay_transitions(fn, trajectories, method)
    steps = trajectories.trajectories
    b, n_t = steps.n_elems(), steps.n_timesteps()
    if b * n_t == 0:
        return TemporalDictTensor.trusted(DictTensor(batch_size=b), steps.lengths, n_t)
    n = b * n_t
    device = steps.device()
    # Views, no copy for contiguous tensors; lengths from the mask needs no host sync.
    flat_steps = TemporalDictTensor.trusted(
        DictTensor.trusted(
            {k: v.reshape((n, 1) + v.shape[2:]) for k, v in steps.items()}, n, device
        ),
        steps.mask().reshape(n).long(),
        1,
    )
    info = trajectories.info
    flat_info = DictTensor.trusted(
        {
            k: v.unsqueeze(1).expand((b, n_t) + v.shape[1:]).reshape((n,) + v.shape[1:])
            for k, v in info.items()
            if not k.startswith(K.AGENT_STATE)
        },
        n,
        info.device(),
    )
    flat = Trajectories(flat_info, flat_steps)
    out, _ = _check_result(fn(flat, 0, DictTensor(batch_size=n)), method, n, "B*T rows")
    out = DictTensor.trusted(
        {k: v.reshape((b, n_t) + v.shape[1:]) for k, v in out.items()}, b, out.device()
    )
    return _as_temporal(out, steps, method)


def _replay_transitions(fn: ReplayMethod, transitions: DictTensor, method: str) -> DictTensor:
    n, device = transitions.n_elems(), transitions.device()
    if n == 0 or device is None:
        return DictTensor(batch_size=n)
    one_step = TemporalDictTensor.trusted(
        DictTensor.trusted({k: v.unsqueeze(1) for k, v in transitions.items()}, n, device),
        torch.ones(n, dtype=torch.long, device=device),
        1,
    )
    flat = Trajectories(DictTensor(batch_size=n), one_step)
    out, _ = _check_result(fn(flat, 0, DictTensor(batch_size=n)), method, n, "N transitions")
    _check_device(out, device, method)
    return out


def _replay_method(agent: Agent, method: str) -> ReplayMethod:
    fn = getattr(agent, method, None)
    if fn is None or not callable(fn):
        raise AttributeError(
            f"cannot replay {type(agent).__name__}: it has no method {method!r}; pass the name "
            "of a method with the signature (trajectories, t, state) -> (output, new_state), "
            "e.g. method='call_replay'"
        )
    return fn


def _agent_info(info: DictTensor, b: int) -> DictTensor:
    agent_info = info.truncate_key(K.AGENT_INFO)
    if agent_info.batch_size is None:
        return DictTensor(batch_size=b)
    return agent_info


def _check_result(
    result: object, method: str, b: int, where: str
) -> tuple[DictTensor, DictTensor]:
    if not (isinstance(result, tuple) and len(result) == 2):
        raise TypeError(
            f"replay: {method} must return (output, new_state), got {type(result).__name__}"
        )
    out, new_state = result
    for what, d in (("output", out), ("new_state", new_state)):
        if not isinstance(d, DictTensor):
            raise TypeError(
                f"replay: {method} returned a {type(d).__name__} as {what} at {where}, "
                "expected a DictTensor"
            )
        if d.n_elems() != b and not (what == "new_state" and d.empty()):
            key = next(iter(d.keys()), None)
            raise ShapeError(
                f"replay: {method} returned {what} with {d.n_elems()} rows at {where} "
                f"(key {key!r}), expected {b} (one row per trajectory step)"
            )
    return out, new_state


def _as_temporal(
    out: DictTensor, steps: TemporalDictTensor, method: str
) -> TemporalDictTensor:
    _check_device(out, steps.device(), method)
    # Shapes and device are checked: skip the lengths re-check (a host sync on a GPU).
    return TemporalDictTensor.trusted(out, steps.lengths, steps.n_timesteps())


def _check_device(out: DictTensor, expected: torch.device | None, method: str) -> None:
    actual = out.device()
    if not out.empty() and expected is not None and not _same_device(actual, expected):
        key = next(iter(out.keys()))
        raise DeviceContractError(
            f"replay: {method} returned {key!r} on {actual}, expected {expected} (the "
            "trajectories' device); move the agent with agent.to(device)",
            argument="action",
            key=key,
            expected=expected,
            actual=actual,
        )
