"""``rlstruct.load_policy(run_dir).act(obs, action_mask=...)``: the policies of runs trained on
``rlstruct/MaskedChoice-v0`` (whose legal actions are not in the observation) play only legal
actions, greedy and sampled, for one observation and a batch; a Dict observation's own
``action_mask`` leaf is honoured; bad masks raise typed errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import rlstruct
from rlstruct.algos import dqn, ppo
from rlstruct.envs.debug import MASKED_CHOICE_ID
from rlstruct.errors import ActionMaskError, ShapeError
from rlstruct.runs.layout import LayoutConfig

A = 16


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("masked_runs")
    out = {}
    for name, module, extra in (("ppo", ppo, {}), ("dqn", dqn, {"learning_starts": 64})):
        cfg = module.Config(env_id=MASKED_CHOICE_ID, max_frames=300, eval_every=0,
                            target_return=None, runs_dir=str(folder / name),
                            layout=LayoutConfig(n_processes=1, n_envs=2), **extra)
        out[name] = Path(module.main(cfg)["run_dir"])
    return out


def _masks(n: int, seed: int = 0) -> np.ndarray:
    """``(n, A)`` int8 masks with 2 legal actions per row (as the env gives them)."""
    rng = np.random.default_rng(seed)
    masks = np.zeros((n, A), np.int8)
    for row in masks:
        row[rng.choice(A, 2, replace=False)] = 1
    return masks


@pytest.mark.timeout(120)
@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_the_policy_plays_legal_actions_only(runs, algo):
    policy = rlstruct.load_policy(runs[algo], seed=0)
    obs, masks = np.tile(np.array([0.5, 1.0], np.float32), (256, 1)), _masks(256)
    rows = np.arange(256)
    for deterministic in (True, False):
        actions = policy.act(obs, deterministic=deterministic, action_mask=masks)
        assert masks[rows, actions].all()
        one = policy.act(obs[0], deterministic=deterministic, action_mask=masks[0])
        assert type(one) is int and masks[0, one]
    # Without the mask the greedy policy plays one action everywhere: mostly an illegal one.
    assert not masks[rows, policy.act(obs)].all()


@pytest.mark.timeout(120)
def test_bad_masks_raise_typed_errors(runs):
    policy = rlstruct.load_policy(runs["ppo"])
    obs = np.zeros((3, 2), np.float32)
    with pytest.raises(ShapeError, match=r"action_mask has shape \(16,\), expected \(3, 16\)"):
        policy.act(obs, action_mask=np.ones(A))
    masks = _masks(3)
    masks[1] = 0
    with pytest.raises(ActionMaskError, match="env 1: the action mask allows no action"):
        policy.act(obs, action_mask=masks)


def test_a_dict_observations_mask_leaf_is_honoured():
    """A Policy over a Dict observation space hands its ``action_mask`` leaf to the agent."""
    from gymnasium import spaces

    from rlstruct.blocks.sampling import ActorAgent
    from rlstruct.runs.policy import Policy

    class Frame(torch.nn.Module):  # a model that reads the Dict's other leaf as its frame
        def forward(self, frame: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            logits = torch.zeros(len(frame), A)
            logits[:, 0] = 10.0  # action 0 preferred: illegal in most masks below
            return logits, torch.zeros(len(frame))

    space = spaces.Dict({"frame": spaces.Box(0.0, 1.0, (2,), np.float32),
                         "action_mask": spaces.MultiBinary(A)})
    policy = Policy(ActorAgent(Frame()), space, spaces.Discrete(A))
    masks = _masks(64, seed=1)
    actions = policy.act({"frame": np.zeros((64, 2), np.float32), "action_mask": masks})
    assert masks[np.arange(64), actions].all()
