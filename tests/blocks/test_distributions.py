"""Policy heads (rlstruct.blocks.distributions): torch.distributions agree, the tanh correction is
the
Jacobian's, greedy actions are deterministic, env actions stay inside the Box."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from torch import distributions as D

from rlstruct import DictTensor
from rlstruct.blocks.distributions import (
    CategoricalHead,
    GaussianHead,
    TanhGaussianHead,
    make_head,
)
from rlstruct.envs import GymEnv
from rlstruct.errors import ConfigError, SpaceError

BOX = spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 1.0], np.float32))


def _params(head, n=64, seed=0, spread=2.0):
    """Random params: features through the head, then random means and log-stds on top."""
    g = torch.Generator().manual_seed(seed)
    dtype = next(head.parameters()).dtype
    params = head(torch.randn(n, 5, generator=g, dtype=dtype)).detach()
    return params + spread * torch.randn(params.shape, generator=g, dtype=dtype).clamp(-1.5, 1.5)


def test_categorical_matches_torch():
    head = CategoricalHead(5, 4)
    p, q = _params(head, seed=1), _params(head, seed=2)
    ref_p, ref_q = D.Categorical(logits=p), D.Categorical(logits=q)
    sample = head.sample(p, torch.Generator().manual_seed(0))
    assert sample.dtype == torch.int64 and sample.shape == (64,)
    torch.testing.assert_close(head.log_prob(p, sample), ref_p.log_prob(sample))
    torch.testing.assert_close(head.entropy(p), ref_p.entropy())
    torch.testing.assert_close(head.kl(p, q), D.kl_divergence(ref_p, ref_q))


@pytest.mark.parametrize("state_dependent_std", [False, True])
def test_gaussian_matches_torch(state_dependent_std):
    head = GaussianHead(5, BOX, state_dependent_std=state_dependent_std)
    p, q = _params(head, seed=1), _params(head, seed=2)
    mean_p, log_std_p = head.split(p)
    mean_q, log_std_q = head.split(q)
    ref_p = D.Independent(D.Normal(mean_p, log_std_p.exp()), 1)
    ref_q = D.Independent(D.Normal(mean_q, log_std_q.exp()), 1)
    sample = head.sample(p, torch.Generator().manual_seed(0))
    torch.testing.assert_close(head.log_prob(p, sample), ref_p.log_prob(sample))
    torch.testing.assert_close(head.entropy(p), ref_p.entropy())
    torch.testing.assert_close(head.kl(p, q), D.kl_divergence(ref_p, ref_q))
    assert torch.all(head.kl(p, p).abs() < 1e-6)


def test_state_independent_log_std_is_one_parameter_for_every_state():
    head = GaussianHead(5, BOX, log_std_init=-0.5)
    log_std = head.split(head(torch.randn(7, 5)))[1]
    assert torch.all(log_std == -0.5)
    assert isinstance(head.log_std, torch.nn.Parameter) and head.log_std.shape == (2,)


def _tanh_reference(head, params):
    mean, log_std = head.split(params)
    base = D.Normal(mean, log_std.exp())
    return D.Independent(D.TransformedDistribution(base, [D.TanhTransform()]), 1)


def test_tanh_gaussian_log_prob_matches_torch_and_is_stable():
    head = TanhGaussianHead(5, BOX).double()
    p = _params(head, seed=3, spread=0.7)
    u = head.sample(p, torch.Generator().manual_seed(0))
    keep = (u.abs() < 6).all(-1)  # torch inverts tanh(u) by atanh: exact only away from +-1
    assert keep.sum() > 30
    p, u = p[keep], u[keep]
    ref = _tanh_reference(head, p)
    torch.testing.assert_close(head.log_prob(p, u), ref.log_prob(torch.tanh(u)))
    big = torch.full(u.shape, 30.0, dtype=u.dtype)  # tanh(30) == 1: atanh would be inf
    assert torch.isfinite(head.log_prob(p, big)).all()


def test_tanh_correction_matches_a_numerical_jacobian():
    """log pi(a) = log N(u) - log |det da/du|, with a = tanh(u) per dimension."""
    torch.manual_seed(0)
    head = TanhGaussianHead(5, BOX).double()
    params = _params(head, n=8)
    u = head.sample(params).detach()
    gaussian = GaussianHead.log_prob(head, params, u)  # the unsquashed density
    for i in range(u.shape[0]):
        jac = torch.autograd.functional.jacobian(torch.tanh, u[i])
        log_det = torch.linalg.slogdet(jac).logabsdet
        torch.testing.assert_close(head.log_prob(params[i : i + 1], u[i : i + 1])[0],
                                   gaussian[i] - log_det)


def test_tanh_entropy_is_an_unbiased_estimate():
    """H = H(N) + E_u[log |d tanh / du|] (torch's Jacobian, by quadrature), per dimension."""
    head = TanhGaussianHead(5, BOX).double()
    p = _params(head, n=1, seed=5)
    mean, log_std = head.split(p[0])
    reference = torch.zeros((), dtype=torch.float64)
    for m, s in zip(mean, log_std.exp()):
        base = D.Normal(m, s)
        u = torch.linspace(float(m - 12 * s), float(m + 12 * s), 200_001, dtype=torch.float64)
        log_det = D.TanhTransform().log_abs_det_jacobian(u, torch.tanh(u))
        reference += base.entropy() + torch.trapezoid(base.log_prob(u).exp() * log_det, u)
    estimate = head.entropy(p.expand(200_000, -1), torch.Generator().manual_seed(1))
    error = float(estimate.mean() - reference)
    assert abs(error) < 4 * float(estimate.std()) / 200_000**0.5 + 1e-3


def test_squashed_kl_is_the_gaussians():
    head = TanhGaussianHead(5, BOX)
    p, q = _params(head, seed=1), _params(head, seed=2)
    torch.testing.assert_close(head.kl(p, q), GaussianHead.kl(head, p, q))


def test_samples_are_reparameterised():
    head = GaussianHead(5, BOX)
    params = head(torch.randn(3, 5))
    head.sample(params).sum().backward()
    assert head.mean.weight.grad is not None and head.log_std.grad is not None


@pytest.mark.parametrize("kind", ["categorical", "gaussian", "tanh"])
def test_greedy_actions_are_deterministic_and_the_mode(kind):
    space = spaces.Discrete(3) if kind == "categorical" else BOX
    head = make_head(space, 5, squash=kind == "tanh")
    params = _params(head, n=16)
    greedy = torch.ones(16, dtype=torch.bool)
    draws = [head.act(params, torch.Generator().manual_seed(s), greedy) for s in range(3)]
    for sample, action in draws[1:]:
        assert torch.equal(sample, draws[0][0]) and torch.equal(action, draws[0][1])
    mode = params.argmax(-1) if kind == "categorical" else params[:, :2]
    assert torch.equal(draws[0][0], mode)
    # Only the marked rows are greedy; the others are sampled from the generator.
    mixed = torch.arange(16) % 2 == 0
    sample, _ = head.act(params, torch.Generator().manual_seed(0), mixed)
    assert torch.equal(sample[mixed], mode[mixed])
    again, _ = head.act(params, torch.Generator().manual_seed(0), mixed)
    assert torch.equal(sample, again)


def test_the_same_generator_seed_gives_the_same_samples():
    head = GaussianHead(5, BOX)
    params = _params(head)
    a = head.sample(params, torch.Generator().manual_seed(7))
    b = head.sample(params, torch.Generator().manual_seed(7))
    c = head.sample(params, torch.Generator().manual_seed(8))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_gaussian_env_action_is_rescaled_and_clipped_and_the_sample_is_kept():
    head = GaussianHead(5, BOX)
    params = _params(head, spread=0.0)
    params[:, :2] = torch.tensor([[10.0, -10.0]])  # far outside the normalised box
    sample, action = head.act(params, torch.Generator().manual_seed(0))
    assert (sample[:, 0] > 1).all() and (sample[:, 1] < -1).all()  # the unclipped sample
    assert torch.all(action[:, 0] == 2.0) and torch.all(action[:, 1] == 0.0)
    inside = head.to_env(torch.tensor([[0.5, 0.0]]))
    torch.testing.assert_close(inside, torch.tensor([[1.0, 0.5]]))  # loc + scale * sample
    assert action.dtype == torch.float32


def test_tanh_env_action_is_rescaled_from_the_unit_box():
    head = TanhGaussianHead(5, BOX)
    u = torch.tensor([[0.0, 0.0], [50.0, -50.0], [-50.0, 50.0]])
    action = head.to_env(u)
    torch.testing.assert_close(action, torch.tensor([[0.0, 0.5], [2.0, 0.0], [-2.0, 1.0]]))


class _RecordingEnv(gym.Env):
    """Records every action it receives; raises if one is outside its Box."""

    def __init__(self, space: spaces.Box, log: list) -> None:
        self.observation_space = spaces.Box(-1.0, 1.0, (5,), np.float32)
        self.action_space = space
        self.log = log

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(5, np.float32), {}

    def step(self, action):
        if not self.action_space.contains(np.asarray(action, self.action_space.dtype)):
            raise AssertionError(f"the env received {action!r}, outside {self.action_space}")
        self.log.append(np.array(action))
        return np.zeros(5, np.float32), 0.0, False, False, {}


@pytest.mark.parametrize("squash", [False, True])
def test_a_box_action_outside_its_bounds_never_reaches_an_env(squash):
    """A policy whose samples are mostly out of bounds: every env still gets in-bounds actions,
    and the stored sample (for the log-prob) is the unclipped one."""
    log: list = []
    env = GymEnv([lambda: _RecordingEnv(BOX, log)] * 4, seed=0)
    head = make_head(env.action_space, 5, squash=squash)
    head.mean.bias.data = torch.tensor([3.0, -3.0])
    torch.manual_seed(0)  # the global RNG, as a user's agent would use it
    obs, _ = env.reset()
    samples = []
    for _ in range(25):
        params = head(obs["frame"].float()).detach()
        params[:, 2:] = 1.0  # std e in the normalised space: wide samples
        sample, action = head.act(params)
        samples.append(sample)
        (obs, _), _ = env.step(DictTensor({"action": action}))
    env.close()
    actions = np.stack(log)
    assert actions.shape == (100, 2)
    assert (actions >= BOX.low).all() and (actions <= BOX.high).all()
    if not squash:  # the samples left the normalised box, the stored ones stay unclipped
        samples = torch.cat(samples)
        assert (samples[:, 0] > 1).float().mean() > 0.5 and (samples[:, 1] < -1).any()
        assert (actions[:, 0] == BOX.high[0]).mean() > 0.5 and (actions[:, 1] == 0.0).any()


def test_make_head_picks_the_head_and_refuses_other_spaces():
    assert isinstance(make_head(spaces.Discrete(3), 5), CategoricalHead)
    assert type(make_head(BOX, 5)) is GaussianHead
    assert not make_head(BOX, 5).state_dependent_std
    squashed = make_head(BOX, 5, squash=True)
    assert type(squashed) is TanhGaussianHead and squashed.state_dependent_std
    shifted = make_head(spaces.Discrete(3, start=2), 5)
    assert shifted.to_env(torch.tensor([0, 2])).tolist() == [2, 4]
    with pytest.raises(SpaceError, match="MultiDiscrete"):
        make_head(spaces.MultiDiscrete([2, 3]), 5)
    with pytest.raises(SpaceError, match="shape \\(D,\\)"):
        make_head(spaces.Box(-1, 1, (2, 2)), 5)
    with pytest.raises(SpaceError, match="bounded Box"):
        make_head(spaces.Box(-np.inf, np.inf, (2,)), 5, squash=True)
    with pytest.raises(ConfigError, match="squash=True needs a Box"):
        make_head(spaces.Discrete(3), 5, squash=True)


def test_unbounded_dimensions_are_neither_rescaled_nor_clipped():
    space = spaces.Box(np.array([-1.0, -np.inf], np.float32), np.array([3.0, np.inf], np.float32))
    head = GaussianHead(5, space)
    action = head.to_env(torch.tensor([[0.0, 1e6], [-5.0, -7.0]]))
    torch.testing.assert_close(action, torch.tensor([[1.0, 1e6], [-1.0, -7.0]]))


@pytest.mark.gpu
@pytest.mark.parametrize("squash", [False, True])
def test_heads_act_on_the_gpu_inside_the_box(squash):
    head = make_head(BOX, 5, squash=squash).to("cuda")
    params = head(torch.randn(256, 5, device="cuda")) * 10
    g = torch.Generator("cuda").manual_seed(0)
    sample, action = head.act(params, g, torch.zeros(256, dtype=torch.bool))
    assert action.device.type == "cuda" and sample.device.type == "cuda"
    low, high = torch.as_tensor(BOX.low, device="cuda"), torch.as_tensor(BOX.high, device="cuda")
    assert bool(((action >= low) & (action <= high)).all())
    assert torch.isfinite(head.log_prob(params, sample)).all()


def test_policy_agent_on_a_categorical_head_draws_what_actor_agent_draws():
    from rlstruct.blocks.nets import HeadActorCritic
    from rlstruct.blocks.sampling import ActorAgent, PolicyAgent

    torch.manual_seed(0)
    model = HeadActorCritic(3, make_head(spaces.Discrete(4), 8), 8)
    obs, state = DictTensor({"frame": torch.randn(64, 3)}), DictTensor(batch_size=64)
    a, b = PolicyAgent(model), ActorAgent(model)
    a.seed(3)
    b.seed(3)
    out_a, out_b = a(state, obs, DictTensor())[0], b(state, obs, DictTensor())[0]
    assert torch.equal(out_a["action"], out_b["action"])
    assert torch.equal(out_a["sample"], out_a["action"])
    torch.testing.assert_close(out_a["logp"], out_b["logp"])


def test_policy_agent_on_a_box_is_seeded_greedy_on_request_and_replays_its_params():
    from rlstruct.agent_replay import replay_agent_stateless
    from rlstruct.blocks.nets import HeadActorCritic
    from rlstruct.blocks.sampling import PolicyAgent, greedy_info

    torch.manual_seed(0)
    model = HeadActorCritic(3, make_head(BOX, 8), 8, normalize_obs=True)
    model.observe(torch.randn(50, 3) * 4)
    obs, state = DictTensor({"frame": torch.randn(32, 3)}), DictTensor(batch_size=32)
    a, b = PolicyAgent(model), PolicyAgent(model)
    a.seed(7)
    b.seed(7)
    first = a(state, obs, DictTensor())[0]
    assert torch.equal(first["sample"], b(state, obs, DictTensor())[0]["sample"])
    assert not torch.equal(first["sample"], a(state, obs, DictTensor())[0]["sample"])
    params, value = model(obs["frame"])
    torch.testing.assert_close(first["logp"], model.head.log_prob(params, first["sample"]))
    torch.testing.assert_close(first["value"], value)
    greedy = a(state, obs, greedy_info().index(torch.zeros(32, dtype=torch.long)))[0]
    torch.testing.assert_close(greedy["action"], model.head.to_env(params[:, :2]))
    replayed = replay_agent_stateless(a, DictTensor({"observation/frame": obs["frame"]}))
    torch.testing.assert_close(replayed["params"], params)
    assert replayed["params"].requires_grad
