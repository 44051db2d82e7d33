"""Every algorithm with a categorical head honours an env's action mask: on
``rlstruct/MaskedChoice-v0`` (2 of 16 actions legal at each step, drawn at random and given in
``info["action_mask"]``; an illegal action ends the episode with reward -10) no illegal action is
taken in 20k steps of training, so every episode returns 20; and PPO with the mask solves the
task within a budget where PPO without it (``rlstruct/MaskedChoiceHidden-v0``) fails."""

from __future__ import annotations

import csv
import importlib
from pathlib import Path
from typing import Any

import pytest

from rlstruct.envs.debug import MASKED_CHOICE_HIDDEN_ID, MASKED_CHOICE_ID
from rlstruct.runs.layout import LayoutConfig

pytestmark = pytest.mark.slow  # worker processes, 20k frames each

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


@pytest.mark.timeout(170)
@pytest.mark.parametrize("algo", sorted(ALGOS))
def test_no_illegal_action_in_20k_steps(algo, tmp_path):
    summary, returns = train(algo, MASKED_CHOICE_ID, tmp_path)
    assert summary["frames"] >= FRAMES
    assert len(returns) >= FRAMES // 20 - 16  # 20-step episodes, the last ones unfinished
    illegal = [r for r in returns if r != 20.0]  # an illegal action: a shorter episode, -10
    assert not illegal, f"{len(illegal)} episode(s) of {len(returns)} ended by illegal actions"


@pytest.mark.timeout(170)
def test_masked_ppo_solves_what_unmasked_ppo_cannot(tmp_path):
    _, masked = train("ppo", MASKED_CHOICE_ID, tmp_path, frames=8000)
    _, unmasked = train("ppo", MASKED_CHOICE_HIDDEN_ID, tmp_path, frames=8000)
    last = lambda r: sum(r[-100:]) / len(r[-100:])  # noqa: E731
    assert last(masked) == 20.0
    assert last(unmasked) < 0.0  # an illegal action within a few steps, whatever it learned


@pytest.mark.timeout(120)
def test_trpo_refuses_masks_it_would_not_honour(tmp_path):
    from rlstruct.algos import trpo
    from rlstruct.errors import ConfigError

    cfg = trpo.Config(env_id=MASKED_CHOICE_ID, max_frames=2000, eval_every=0, target_return=None,
                      runs_dir=str(tmp_path), layout=LayoutConfig(n_processes=1, n_envs=2))
    with pytest.raises(ConfigError, match=r"trpo does not honour .*action masks"):
        trpo.main(cfg)
