"""rlstruct/blocks/masks.py and the agents that use it: a masked categorical policy never
samples an illegal action, its log-probabilities and entropy are those of the renormalised
distribution over the legal actions, its greedy action is the best legal one, its gradients are
finite; the agents' replay masks with the stored ``observation/action_mask``, so the stored
and replayed log-probabilities agree; DQN's choices and target are legal."""

from __future__ import annotations

import pytest
import torch
from gymnasium import spaces

from rlstruct import DictTensor, Trajectories, replay_agent, replay_agent_stateless
from rlstruct import keys as K
from rlstruct.algos import dqn
from rlstruct.blocks import functional as F
from rlstruct.blocks.distributions import CategoricalHead, GaussianHead, space_spec
from rlstruct.blocks.masks import (
    epsilon_greedy,
    mask_head_params,
    mask_logits,
    with_next_mask,
)
from rlstruct.blocks.recurrent import RecurrentAgent
from rlstruct.blocks.sampling import ActorAgent, CategoricalSampler, PolicyAgent, greedy_info
from rlstruct.blocks.zoo import actor_critic
from rlstruct.errors import SpaceError
from rlstruct.temporal import TemporalDictTensor

A = 6


def _masks(n: int, seed: int = 0) -> torch.Tensor:
    """``(n, A)`` random masks with 1 to A-1 legal actions per row."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(n, A, generator=g) < 0.4
    mask[torch.arange(n), torch.randint(A, (n,), generator=g)] = True  # >= 1 legal
    mask[torch.arange(n), torch.randint(A, (n,), generator=g)] &= ~mask.all(1)  # < A legal
    return mask


def test_masked_head_samples_legal_actions_only():
    head, mask = CategoricalHead(4, A), _masks(64)
    # Illegal actions get the largest logits: an unmasked head would pick them often.
    logits = torch.where(mask, torch.zeros(64, A), torch.full((64, A), 5.0))
    masked = mask_logits(logits, mask)
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        sample = head.sample(masked, g)
        assert bool(mask[torch.arange(64), sample].all())
        sampled = CategoricalSampler()(masked, DictTensor())
        assert bool(mask[torch.arange(64), sampled].all())
    assert not bool(mask[torch.arange(64), head.sample(logits, g)].all())  # unmasked: illegal


def test_masked_logp_and_entropy_are_the_renormalised_distributions():
    head, mask = CategoricalHead(4, A), _masks(32, seed=1)
    logits = torch.randn(32, A, dtype=torch.float64)
    masked = mask_logits(logits, mask)
    probs = torch.where(mask, logits.exp(), torch.zeros_like(logits))
    probs = probs / probs.sum(-1, keepdim=True)  # the distribution over the legal actions
    action = torch.multinomial(probs, 1).squeeze(1)
    expected_logp = probs.gather(1, action[:, None]).squeeze(1).log()
    expected_entropy = -(probs * probs.clamp_min(1e-300).log()).sum(-1)
    torch.testing.assert_close(head.log_prob(masked, action), expected_logp)
    torch.testing.assert_close(F.categorical_log_prob(masked, action), expected_logp)
    torch.testing.assert_close(head.entropy(masked), expected_entropy)
    torch.testing.assert_close(F.categorical_entropy(masked), expected_entropy)
    torch.testing.assert_close(head.kl(masked, masked), torch.zeros(32, dtype=torch.float64))


def test_masked_greedy_is_the_best_legal_action():
    head, mask = CategoricalHead(4, A), _masks(32, seed=2)
    logits = torch.randn(32, A)
    best = torch.where(mask, logits, torch.full_like(logits, -1e30)).argmax(-1)
    assert head.greedy(mask_logits(logits, mask)).equal(best)
    assert not head.greedy(logits).equal(best)  # the mask changes some greedy actions


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_masked_gradients_and_values_are_finite(dtype):
    head, mask = CategoricalHead(4, A), _masks(16, seed=3)
    logits = torch.randn(16, A).to(dtype).requires_grad_()
    masked = mask_logits(logits, mask)
    action = head.greedy(masked)
    loss = -(head.log_prob(masked, action).sum() + head.entropy(masked).sum()
             + head.kl(masked.detach(), masked).sum())
    loss.backward()
    assert bool(torch.isfinite(loss)) and bool(torch.isfinite(logits.grad).all())
    assert bool((logits.grad[~mask] == 0).all())  # nothing flows to an illegal logit


def test_a_mask_on_a_gaussian_head_is_refused():
    head = GaussianHead(4, spaces.Box(-1.0, 1.0, (2,)))
    with pytest.raises(SpaceError, match="action_mask"):
        mask_head_params(head, torch.zeros(3, 4), torch.ones(3, 2, dtype=torch.bool))


def test_epsilon_greedy_explores_and_exploits_legal_actions_only():
    mask, q = _masks(256, seed=4), torch.randn(256, A)
    g = torch.Generator().manual_seed(0)
    explored = epsilon_greedy(q, mask, torch.ones(1), g)
    assert bool(mask[torch.arange(256), explored].all())
    assert len(set(explored.tolist())) == A  # uniform over the legal ones: every action shows
    greedy = epsilon_greedy(q, mask, None, g)
    assert greedy.equal(mask_logits(q, mask).argmax(-1))
    assert not bool(mask[torch.arange(256), epsilon_greedy(q, None, torch.ones(1), g)].all())


def test_dqn_target_maxes_over_the_legal_next_actions():
    q = torch.zeros(2, 3, requires_grad=True)
    next_q = torch.tensor([[9.0, 1.0, 2.0], [0.0, 5.0, 3.0]])
    next_mask = torch.tensor([[False, True, True], [True, False, True]])
    flags = torch.zeros(2, dtype=torch.bool)
    _, stats = dqn.dqn_loss(q, torch.zeros(2, dtype=torch.long), torch.zeros(2), flags, flags,
                            next_q, next_q, gamma=1.0, double=True, next_mask=next_mask)
    assert stats["td_error"] == pytest.approx((2.0 + 3.0) / 2)  # max over legal: 2 and 3
    _, unmasked = dqn.dqn_loss(q, torch.zeros(2, dtype=torch.long), torch.zeros(2), flags, flags,
                               next_q, next_q, gamma=1.0, double=True)
    assert unmasked["td_error"] == pytest.approx((9.0 + 5.0) / 2)


def test_qagent_acts_legally():
    model = dqn.QNetwork(obs_dim=3, n_actions=A, hidden=8, dueling=False)
    mask = _masks(64, seed=5)
    obs = DictTensor({K.FRAME: torch.randn(64, 3), K.ACTION_MASK: mask})
    for info in (DictTensor({"epsilon": torch.ones(1)}), DictTensor({"epsilon": torch.zeros(1)})):
        action = dqn.QAgent(model)(DictTensor(), obs, info)[0][K.ACTION_KEY]
        assert bool(mask[torch.arange(64), action].all())


def test_with_next_mask_fills_all_legal_without_an_env_mask():
    steps = TemporalDictTensor({K.NEXT_REWARD: torch.zeros(2, 3)}, torch.tensor([3, 1]))
    traj = with_next_mask(Trajectories(DictTensor({"x": torch.zeros(2)}), steps), A)
    assert traj.trajectories[K.NEXT_ACTION_MASK].shape == (2, 3, A)
    assert bool(traj.trajectories[K.NEXT_ACTION_MASK].all())


# ------------------------------------------------------------------------------ agents
def _collect(agent, n: int = 8, t: int = 5, frame_dim: int = 3, seed: int = 0) -> Trajectories:
    """``t`` steps of ``agent`` on random frames and masks, stored as trajectories."""
    torch.manual_seed(seed)
    agent.seed(seed)
    state = agent.initial_state(DictTensor(), n)
    rows = []
    for step in range(t):
        obs = DictTensor({K.FRAME: torch.randn(n, frame_dim), K.ACTION_MASK: _masks(n, step),
                          K.INITIAL_STATE: torch.full((n,), step == 0)})
        out, state = agent(state, obs, DictTensor())
        rows.append((obs, out))
    data = {}
    for key in (K.FRAME, K.ACTION_MASK, K.INITIAL_STATE):
        data[K.OBSERVATION + key] = torch.stack([o[key] for o, _ in rows], 1)
    for key in rows[0][1]:
        data[K.ACTION + key] = torch.stack([out[key] for _, out in rows], 1)
    data[K.NEXT_FRAME] = data[K.OBS_FRAME]
    info = DictTensor({K.AGENT_STATE + "h": torch.zeros(n, 16)})
    return Trajectories(info, TemporalDictTensor(data, torch.full((n,), t)))


@pytest.mark.parametrize("kind", ["policy", "actor", "recurrent"])
def test_agents_act_legally_and_replay_the_stored_masks(kind):
    space = space_spec(spaces.Discrete(A))
    if kind == "recurrent":
        model = actor_critic("mlp-gru", (3,), space, 8)
        agent, replay, key = RecurrentAgent(model), replay_agent, "params"
    else:
        model = actor_critic("mlp", (3,), space, 8)
        agent = PolicyAgent(model) if kind == "policy" else ActorAgent(model)
        replay, key = replay_agent_stateless, "params" if kind == "policy" else "logits"
    with torch.no_grad():
        # Large logits for illegal actions would show any leak: make the head prefer action 0.
        model.head.logits.bias.copy_(torch.tensor([8.0] + [0.0] * (A - 1)))
    with torch.no_grad():
        traj = _collect(agent)
    steps = traj.trajectories
    mask, action = steps[K.OBS_ACTION_MASK], steps[K.STORED_ACTION]
    assert bool(mask.gather(-1, action.unsqueeze(-1)).all())
    logp = F.categorical_log_prob(replay(agent, traj)[key], action)
    torch.testing.assert_close(logp, steps[K.STORED_LOGP])  # old and new agree
    unmasked = Trajectories(traj.info, steps.get([k for k in steps
                                                  if k != K.OBS_ACTION_MASK]))
    assert not torch.allclose(F.categorical_log_prob(replay(agent, unmasked)[key], action),
                              steps[K.STORED_LOGP])
    greedy = agent(agent.initial_state(DictTensor(), 8), DictTensor({
        K.FRAME: torch.randn(8, 3), K.ACTION_MASK: _masks(8, 9),
        K.INITIAL_STATE: torch.ones(8, dtype=torch.bool)}), greedy_info())[0][K.ACTION_KEY]
    assert bool(_masks(8, 9)[torch.arange(8), greedy].all())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_masks_on_cuda_with_cpu_masks():
    mask, q = _masks(64, seed=6), torch.randn(64, A, device="cuda")
    g = torch.Generator("cuda").manual_seed(0)
    action = epsilon_greedy(q, mask, torch.full((64,), 0.5), g)
    assert action.device.type == "cuda" and bool(mask[torch.arange(64), action.cpu()].all())
    head = CategoricalHead(4, A).cuda()
    sample = head.sample(mask_logits(q, mask), g)
    assert bool(mask[torch.arange(64), sample.cpu()].all())
