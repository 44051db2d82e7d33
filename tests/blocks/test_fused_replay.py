"""The learners' fast replay of a recurrent model (rlstruct.blocks.recurrent.replay_rows): the
cell's steps fused by ``Core.sequence`` and every step's encoder in one batch
(``RecurrentAgent.replay_sequence``) give what the cell stepped through time and
``replay_agent`` give, outputs and gradients, restarts, padding and action masks included;
an agent under ``CheckDevice`` is replayed step by step, its checks run."""

from __future__ import annotations

import pytest
import torch
from gymnasium import spaces

from rlstruct import CheckDevice, DictTensor, Trajectories, replay_agent
from rlstruct import keys as K
from rlstruct.blocks.distributions import space_spec
from rlstruct.blocks.recurrent import RecurrentAgent, bootstrap_steps, replay_rows
from rlstruct.blocks.zoo import FUSED_MIN_STEPS, RECURRENT_MODELS, Core, actor_critic
from rlstruct.temporal import TemporalDictTensor

N_ACTIONS = 4


def stepped(core: Core, x: torch.Tensor, state: torch.Tensor,
            starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference: ``Core.forward`` step by step, restarting from zeros where ``starts``."""
    outs, states = [], []
    for t in range(x.shape[1]):
        state = state.masked_fill(starts[:, t, None], 0.0)
        out, state = core(x[:, t], state)
        outs.append(out)
        states.append(state)
    return torch.stack(outs, 1), torch.stack(states, 1)


def flags(shape: tuple[int, int], p: float, seed: int) -> torch.Tensor:
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed)) < p


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("n_t", [FUSED_MIN_STEPS - 3, 5 * FUSED_MIN_STEPS])
def test_core_sequence_is_the_cell_stepped_through_time_with_restarts(kind, n_t):
    torch.manual_seed(0)
    core = Core(kind, 6, 5)
    x = torch.randn(3, n_t, 6, requires_grad=True)
    state = torch.randn(3, core.state_size)
    starts, keep = flags((3, n_t), 0.08, 1), flags((3, n_t), 0.1, 2)
    out, states = core.sequence(x, state, starts, keep)
    ref_out, ref_states = stepped(core, x, state, starts)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    whole = keep.clone()
    whole[:, -1] = True  # a row's last step: the state the next segment would continue from
    torch.testing.assert_close(states[whole], ref_states[whole], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(states[..., :5], ref_states[..., :5], atol=1e-5, rtol=1e-5)
    if kind == "gru":  # a GRU's state is its output: whole at every step
        torch.testing.assert_close(states, ref_states, atol=1e-5, rtol=1e-5)
    # the gradients through both, to the inputs and to the cell's weights
    grads = torch.autograd.grad(out.square().sum() + states[whole].sum(),
                                [x, *core.parameters()])
    ref_grads = torch.autograd.grad(ref_out.square().sum() + ref_states[whole].sum(),
                                    [x, *core.parameters()])
    for g, ref in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, ref, atol=1e-4, rtol=1e-4)


def test_a_long_run_of_an_lstm_is_fused_and_its_unkept_cell_states_are_nan():
    core = Core("lstm", 4, 3)
    n_t = 3 * FUSED_MIN_STEPS
    none = torch.zeros(2, n_t, dtype=torch.bool)
    _, states = core.sequence(torch.randn(2, n_t, 4), torch.zeros(2, 6), none, none)
    assert states[:, :-1, 3:].isnan().all()  # c after the steps nobody reads: not computed
    assert not states[:, -1].isnan().any() and not states[..., :3].isnan().any()


def segment(model: str, b: int = 3, n_t: int = 24, seed: int = 0,
            obs: dict[str, torch.Tensor] | None = None) -> Trajectories:
    """A segment ``(B, T)`` as a batcher stores one: the state at its start, episodes that
    end (a terminated or truncated step, then a restart), a row shorter than the others, and
    action masks; ``obs``: the observation's keys ``(B, T, ...)`` instead of a frame."""
    g = torch.Generator().manual_seed(seed)
    if obs is not None:
        frame = next(iter(obs.values()))
    elif model.startswith("cnn"):
        frame = torch.randint(0, 256, (b, n_t, 1, 84, 84), generator=g, dtype=torch.uint8)
    else:
        frame = torch.randn(b, n_t, 5, generator=g)
    obs = obs or {K.OBS_FRAME: frame}
    terminated = torch.rand(b, n_t, generator=g) < 0.06
    truncated = (torch.rand(b, n_t, generator=g) < 0.03) & ~terminated
    starts = torch.zeros(b, n_t, dtype=torch.bool)
    starts[:, 1:] = (terminated | truncated)[:, :-1]
    starts[0, 0] = True
    mask = torch.rand(b, n_t, N_ACTIONS, generator=g) < 0.7
    mask[..., 0] = True
    net = actor_critic(model, tuple(frame.shape[2:]), space_spec(spaces.Discrete(N_ACTIONS)), 8)
    steps = TemporalDictTensor(DictTensor({
        **obs, K.OBS_INITIAL_STATE: starts, K.OBS_ACTION_MASK: mask,
        K.NEXT_TERMINATED: terminated, K.NEXT_TRUNCATED: truncated,
    }), torch.tensor([n_t, n_t - 7, n_t])[:b])
    info = DictTensor({K.AGENT_STATE + "h": torch.randn(b, net.state_size, generator=g)})
    return Trajectories(info, steps)


@pytest.mark.parametrize("model", RECURRENT_MODELS)
def test_replay_sequence_gives_what_replay_agent_gives_outputs_and_gradients(model):
    torch.manual_seed(1)
    traj = segment(model)
    agent = RecurrentAgent(actor_critic(model, tuple(traj.trajectories[K.OBS_FRAME].shape[2:]),
                                        space_spec(spaces.Discrete(N_ACTIONS)), 8))
    fast, ref = replay_rows(agent, traj), replay_agent(agent, traj)
    valid, read = traj.trajectories.mask(), bootstrap_steps(traj.trajectories)
    assert fast.lengths.equal(ref.lengths)
    for key in ("params", K.VALUE):
        torch.testing.assert_close(fast[key][valid], ref[key][valid], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fast["h"][read & valid], ref["h"][read & valid],
                               atol=1e-5, rtol=1e-5)
    illegal = ~traj.trajectories[K.OBS_ACTION_MASK][valid]
    assert (fast["params"][valid][illegal] < -1e30).all()  # the masks applied

    def grads(out: TemporalDictTensor) -> list[torch.Tensor]:
        loss = out["params"][valid].logsumexp(-1).sum() + out[K.VALUE][valid].square().sum()
        return torch.autograd.grad(loss, list(agent.model.parameters()))

    for g, g_ref in zip(grads(fast), grads(ref), strict=True):
        torch.testing.assert_close(g, g_ref, atol=1e-4, rtol=1e-3)


def test_an_agent_under_check_device_is_replayed_step_by_step_with_its_checks():
    traj = segment("mlp-lstm", n_t=4 * FUSED_MIN_STEPS)
    agent = RecurrentAgent(actor_critic("mlp-lstm", (5,), space_spec(spaces.Discrete(N_ACTIONS)),
                                        8))
    checked = CheckDevice(agent, "cpu")
    out = replay_rows(checked, traj)
    assert out["h"].equal(replay_agent(agent, traj)["h"])  # whole at every step: no fused run
    assert replay_rows(agent, traj)["h"].isnan().any()  # where the fast path leaves c unread


def test_a_recurrent_model_behind_a_multi_input_encoder_replays_as_replay_agent_does():
    import numpy as np

    from rlstruct.blocks.multi_input import feature_size, model_factory, obs_spec

    space = spaces.Dict({"image": spaces.Box(0, 255, (1, 16, 16), np.uint8),
                         "vector": spaces.Box(-1, 1, (3,), np.float32)})
    spec = obs_spec(space)
    torch.manual_seed(2)
    net = model_factory(spec, actor_critic, "mlp-gru", (feature_size(spec),),
                        space_spec(spaces.Discrete(N_ACTIONS)), 8)()
    agent = RecurrentAgent(net)
    g, b, n_t = torch.Generator().manual_seed(3), 3, 3 * FUSED_MIN_STEPS
    traj = segment("mlp-gru", b, n_t, obs={
        K.OBSERVATION + "image": torch.randint(0, 256, (b, n_t, 1, 16, 16), generator=g,
                                               dtype=torch.uint8),
        K.OBSERVATION + "vector": torch.rand(b, n_t, 3, generator=g) * 2 - 1})
    fast, ref = replay_rows(agent, traj), replay_agent(agent, traj)
    valid = traj.trajectories.mask()
    for key in ("params", K.VALUE, "h"):  # a GRU's state: whole at every step
        torch.testing.assert_close(fast[key][valid], ref[key][valid], atol=1e-5, rtol=1e-5)
