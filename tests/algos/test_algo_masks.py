"""Every algorithm with a categorical head honours an env's action mask: on
``rlstruct/MaskedChoice-v0`` (2 of 16 actions legal at each step, drawn at random and given in
``info["action_mask"]``; an illegal action ends the episode with reward -10) no illegal action is
taken in 20k steps of training, so every episode returns 20; and PPO with the mask solves the
task within a budget where PPO without it (``rlstruct/MaskedChoiceHidden-v0``) fails. The
learners' loss recomputation masks with the stored ``observation/action_mask``: before an update,
PPO's ratio and IMPALA's and APPO's importance weights are exactly 1."""

from __future__ import annotations

import csv
import importlib
from pathlib import Path
from typing import Any

import pytest
import torch
from gymnasium import spaces

from rlstruct import SerialBatcher
from rlstruct.algos import appo, impala, ppo
from rlstruct.blocks.distributions import space_spec
from rlstruct.blocks.recurrent import RecurrentAgent
from rlstruct.blocks.zoo import actor_critic
from rlstruct.envs import GymEnvInf
from rlstruct.envs.debug import MASKED_CHOICE_DICT_ID, MASKED_CHOICE_HIDDEN_ID, MASKED_CHOICE_ID
from rlstruct.runs.layout import LayoutConfig

FRAMES = 20_000
#: algorithm: Config arguments beside the common ones (a quick run of 20k frames).
ALGOS: dict[str, dict[str, Any]] = {
    "reinforce": {},
    "a2c": {},
    "ppo": {"n_epochs": 2},
    "ppo-gru": {"n_epochs": 1, "model": "mlp-gru", "minibatch_size": 256},
    "impala": {"layout": LayoutConfig(learner_device="cpu", n_processes=1, n_envs=8,
                                      pipeline=2)},
    "appo": {"layout": LayoutConfig(learner_device="cpu", n_processes=1, n_envs=8,
                                    pipeline=2), "n_epochs": 1},
    "dqn": {"updates_per_batch": 1, "learning_starts": 500},
}


def train(algo: str, env_id: str, folder: Path, frames: int = FRAMES,
          **extra: Any) -> tuple[dict[str, Any], list[float]]:
    """``(summary, episode returns)`` of a run of ``algo`` on ``env_id``, in this process."""
    module = importlib.import_module(f"rlstruct.algos.{algo.split('-')[0]}")
    kw: dict[str, Any] = {"layout": LayoutConfig(learner_device="cpu", n_processes=1, n_envs=8)}
    kw.update(ALGOS[algo])
    kw.update(extra)
    summary = module.main(module.Config(env_id=env_id, max_frames=frames, eval_every=0,
                                        target_return=None, time_budget=120,
                                        runs_dir=str(folder), **kw))
    with open(Path(summary["run_dir"]) / "episodes.csv", newline="") as f:
        returns = [float(row["return"]) for row in csv.DictReader(f)]
    return summary, returns


@pytest.mark.slow  # worker processes, 20k frames each
@pytest.mark.timeout(170)
@pytest.mark.parametrize("algo", sorted(ALGOS))
def test_no_illegal_action_in_20k_steps(algo, tmp_path):
    summary, returns = train(algo, MASKED_CHOICE_ID, tmp_path)
    assert summary["frames"] >= FRAMES
    assert len(returns) >= FRAMES // 20 - 16  # 20-step episodes, the last ones unfinished
    illegal = [r for r in returns if r != 20.0]  # an illegal action: a shorter episode, -10
    assert not illegal, f"{len(illegal)} episode(s) of {len(returns)} ended by illegal actions"


@pytest.mark.slow  # a Dict observation: the mask leaf masks, the other leaf is the model's input
@pytest.mark.timeout(170)
@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_the_mask_as_a_dict_leaf_sb3_contrib_layout(algo, tmp_path):
    summary, returns = train(algo, MASKED_CHOICE_DICT_ID, tmp_path, frames=4000)
    assert summary["frames"] >= 4000 and len(returns) >= 4000 // 20 - 16
    assert all(r == 20.0 for r in returns), [r for r in returns if r != 20.0]


@pytest.mark.slow
@pytest.mark.timeout(170)
def test_masked_ppo_solves_what_unmasked_ppo_cannot(tmp_path):
    _, masked = train("ppo", MASKED_CHOICE_ID, tmp_path, frames=8000)
    _, unmasked = train("ppo", MASKED_CHOICE_HIDDEN_ID, tmp_path, frames=8000)
    last = lambda r: sum(r[-100:]) / len(r[-100:])  # noqa: E731
    assert last(masked) == 20.0
    assert last(unmasked) < 0.0  # an illegal action within a few steps, whatever it learned


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_trpo_refuses_masks_it_would_not_honour(tmp_path):
    from rlstruct.algos import trpo
    from rlstruct.errors import ConfigError

    cfg = trpo.Config(env_id=MASKED_CHOICE_ID, max_frames=2000, eval_every=0, target_return=None,
                      runs_dir=str(tmp_path), layout=LayoutConfig(n_processes=1, n_envs=2))
    with pytest.raises(ConfigError, match=r"trpo does not honour .*action masks"):
        trpo.main(cfg)


# ------------------------------------------------------- the learners replay the stored masks
def _segment(create_agent: Any, model: torch.nn.Module, n_timesteps: int = 8) -> Any:
    """One segment ``(4, n_timesteps)`` of ``create_agent(model)`` on MaskedChoice."""
    with SerialBatcher(n_timesteps, create_agent=create_agent, agent_args={"model": model},
                       create_env=GymEnvInf, env_args={"env": MASKED_CHOICE_ID, "n_envs": 4},
                       seeds=0) as batcher:
        batcher.reset()
        batcher.execute()
        return batcher.get()[0]


def _model(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return actor_critic(kind, (2,), space_spec(spaces.Discrete(16)), 16)


@pytest.mark.parametrize("kind", ["mlp", "mlp-gru"])
def test_ppo_replays_the_stored_masks_its_ratio_starts_at_one(kind):
    model = _model(kind)
    agent = RecurrentAgent(model) if kind == "mlp-gru" else ppo.PPOAgent(model)
    traj = _segment(type(agent), model)
    cfg = ppo.Config(model=kind, n_timesteps=8, n_epochs=1, minibatch_size=16)
    stats = ppo.learn(agent, None, traj, cfg, step=lambda *args: None)  # no update
    assert stats["approx_kl"] == pytest.approx(0.0, abs=1e-6)
    assert stats["clip_fraction"] == 0.0


@pytest.mark.parametrize("kind", ["mlp", "mlp-gru"])
def test_appo_and_impala_importance_weights_are_one_before_an_update(kind):
    model = _model(kind)
    traj = _segment(appo.BehaviourAgent, model)
    _, rho = appo.vtrace_batch(appo.BehaviourAgent(model), traj, appo.Config(model=kind))
    torch.testing.assert_close(rho, torch.ones_like(rho))
    _, stats = impala.vtrace_loss(impala.BehaviourAgent(model), traj, impala.Config(model=kind))
    assert float(stats["rho_mean"]) == pytest.approx(1.0)
