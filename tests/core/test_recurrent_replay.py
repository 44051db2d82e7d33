"""A recurrent agent's memory through collection and replay (rlstruct.blocks.recurrent):
``replay_agent`` over a stored segment, from the state the batcher stored at its start
(``info["agent_state/h"]``), reproduces what the agent returned while collecting EXACTLY
(``logp``, ``value``, ``h``), on segments that cross episode boundaries (the memory restarts
where ``observation/initial_state``); and ``bootstrap_values`` is the hand-written rule."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlstruct import SerialBatcher, replay_agent
from rlstruct import keys as K
from rlstruct.blocks.distributions import space_spec
from rlstruct.blocks.recurrent import STORED_STATE, RecurrentAgent, bootstrap_values
from rlstruct.blocks.zoo import actor_critic
from rlstruct.dicttensor import DictTensor
from rlstruct.envs import CARTPOLE_NOVEL_ID, GymEnvInf
from rlstruct.temporal import TemporalDictTensor
from rlstruct.trajectories import Trajectories

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("one_torch_thread")]

T = 24
SEGMENTS = 3


class TinyImageEnv(gym.Env):
    """Random uint8 frames ``(1, 84, 84)``; an episode terminates with probability 0.2 per
    step and is truncated at its 6th step: short episodes, both kinds of end."""

    observation_space = spaces.Box(0, 255, (1, 84, 84), np.uint8)
    action_space = spaces.Discrete(2)

    def _frame(self) -> np.ndarray:
        return self.np_random.integers(0, 256, (1, 84, 84), dtype=np.uint8)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._frame(), {}

    def step(self, action):
        self.t += 1
        terminated = bool(self.np_random.random() < 0.2)
        return self._frame(), float(action), terminated, self.t >= 6 and not terminated, {}


def image_env(n_envs: int, seed: int) -> GymEnvInf:
    return GymEnvInf([TinyImageEnv] * n_envs, seed=seed)


def novel_env(n_envs: int, seed: int) -> GymEnvInf:
    return GymEnvInf(CARTPOLE_NOVEL_ID, n_envs=n_envs, seed=seed)


def make_agent(model: str, obs_shape: tuple[int, ...], hidden: int) -> RecurrentAgent:
    return RecurrentAgent(actor_critic(model, obs_shape, space_spec(spaces.Discrete(2)), hidden))


#: model -> (env factory, observation shape, width): mlp models on CartPoleNoVel, the CNN on
#: the tiny image env.
CASES = {
    "mlp-lstm": (novel_env, (2,), 16),
    "mlp-gru": (novel_env, (2,), 16),
    "cnn-lstm": (image_env, (1, 84, 84), 8),
}


def collect(model: str, n_envs: int = 3) -> tuple[RecurrentAgent, list[Trajectories]]:
    """``SEGMENTS`` consecutive segments of ``T`` steps, and the batcher's acting agent."""
    create_env, shape, hidden = CASES[model]
    with SerialBatcher(T, make_agent, {"model": model, "obs_shape": shape, "hidden": hidden},
                       create_env, {"n_envs": n_envs}, seeds=5) as batcher:
        batcher.reset()
        segments = []
        for _ in range(SEGMENTS):
            batcher.execute()
            segments.append(batcher.get()[0])
        return batcher.agent, segments


@pytest.mark.parametrize("model", sorted(CASES))
def test_replay_from_the_stored_state_reproduces_the_collected_outputs_exactly(model):
    agent, segments = collect(model)
    steps = [traj.trajectories for traj in segments]
    starts = torch.cat([s[K.OBS_INITIAL_STATE][:, 1:] for s in steps])
    assert bool(starts.any()), "no episode starts inside a segment: the test proves nothing"
    # The state at a segment's start is the state after the previous segment's last step.
    for before, traj in zip(steps, segments[1:]):
        assert torch.equal(traj.info["agent_state/h"], before[STORED_STATE][:, -1])
    assert bool(segments[-1].info["agent_state/h"].abs().sum() > 0)
    head = agent.model.head
    for traj, s in zip(segments, steps, strict=True):
        with torch.no_grad():
            replayed = replay_agent(agent, traj)
        assert torch.equal(head.log_prob(replayed["params"], s["action/sample"]), s["action/logp"])
        assert torch.equal(replayed["value"], s["action/value"])
        assert torch.equal(replayed["h"], s[STORED_STATE])


def test_a_replay_without_the_resets_or_the_stored_state_differs():
    """The exact replay above needs both: the resets at episode starts, and the stored state at
    the segment's start (the checks can fail)."""
    agent, segments = collect("mlp-gru")
    traj = segments[-1]
    s = traj.trajectories
    starts = s[K.OBS_INITIAL_STATE]
    assert bool(starts[:, 1:].any())
    with torch.no_grad():
        no_resets = Trajectories(traj.info, TemporalDictTensor(
            {**dict(s.items()), K.OBS_INITIAL_STATE: torch.zeros_like(starts)}, s.lengths))
        replayed = replay_agent(agent, no_resets)
        assert not torch.equal(replayed["h"], s[STORED_STATE])
        # From zeros instead of the stored state: the first episode of each row differs.
        info = DictTensor({k: v for k, v in traj.info.items() if not k.startswith("agent_state/")})
        from_zeros = Trajectories(info, s)
        fresh = replay_agent(agent, from_zeros)
        assert not torch.equal(fresh["h"][:, 0], s[STORED_STATE][:, 0])


def expected_bootstrap(model: torch.nn.Module, traj: Trajectories, value: torch.Tensor,
                       h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rule by hand: ``(V', asked)``, ``asked`` true where the model values the true next
    observation under the state after the step (an episode's end, a row's last step)."""
    s = traj.trajectories
    out, asked = torch.zeros_like(value), torch.zeros_like(value, dtype=torch.bool)
    for b in range(value.shape[0]):
        last = int(s.lengths[b]) - 1
        for t in range(last + 1):
            ended = bool(s[K.NEXT_TERMINATED][b, t] or s[K.NEXT_TRUNCATED][b, t])
            if ended or t == last:
                with torch.no_grad():
                    out[b, t] = model.value(s[K.NEXT_FRAME][b, t][None], h[b, t][None])[0]
                asked[b, t] = True
            else:
                out[b, t] = value[b, t + 1]
    return out, asked


@pytest.mark.parametrize("model", ["mlp-lstm", "cnn-lstm"])
def test_bootstrap_values_is_the_next_steps_value_or_the_models_under_h(model):
    agent, segments = collect(model)
    for traj in segments:
        s = traj.trajectories
        value, h = s["action/value"], s[STORED_STATE]
        got = bootstrap_values(agent.model, traj, value, h)
        want, asked = expected_bootstrap(agent.model, traj, value, h)
        ends = s[K.NEXT_TERMINATED] | s[K.NEXT_TRUNCATED]
        assert bool(ends.any()) and bool(asked[:, -1].all())
        assert torch.equal(got[~asked], want[~asked])  # copied: the next step's value
        torch.testing.assert_close(got[asked], want[asked], rtol=1e-6, atol=1e-6)
        # At an episode's end the value is the TRUE final observation's, not the next step's
        # (the new episode's first observation).
        inside = ends.clone()
        inside[:, -1] = False
        if bool(inside.any()):
            shifted = torch.cat([value[:, 1:], value[:, -1:]], 1)
            assert not torch.allclose(got[inside], shifted[inside])


def test_bootstrap_values_of_replayed_outputs_keeps_no_graph():
    agent, segments = collect("mlp-gru")
    traj = segments[0]
    replayed = replay_agent(agent, traj)
    assert replayed["value"].requires_grad
    v_next = bootstrap_values(agent.model, traj, replayed["value"], replayed["h"])
    assert not v_next.requires_grad
    assert torch.equal(v_next, bootstrap_values(agent.model, traj, traj.trajectories[
        "action/value"], traj.trajectories[STORED_STATE]))
