"""A resumed run collects its first segment with the checkpoint's policy (issue 38, item 1), for
every algorithm.

Each algorithm trains briefly (one process, ``n_processes=1``: a SerialBatcher, whose agent is
the batcher's own copy of the model; IMPALA and APPO, pipelined, with one worker process that
receives the model when the batcher starts), checkpoints, and is resumed. The weights each
training batcher is built with are recorded: the resumed session's must be the checkpoint's,
which differ from the freshly built (seeded) model's that the first session started from.
Before the fix the batcher was built from the model before the checkpoint's weights were loaded
into it, and its first segment was collected with the untrained policy (REINFORCE publishes its
weights before each collection, so its segments were right; its batcher too is now built with
the checkpoint's weights).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import rlstruct.runs.run as run_module
from rlstruct.algos import a2c, appo, dqn, impala, ppo, reinforce, sac, trpo
from rlstruct.batchers.serial import SerialBatcher
from rlstruct.runs.layout import LayoutConfig

#: algorithm -> (module, the smallest config that learns in its first iterations).
SMALL: dict[str, tuple[Any, dict[str, Any]]] = {
    "reinforce": (reinforce, {}),
    "a2c": (a2c, {"n_timesteps": 8}),
    "ppo": (ppo, {"n_timesteps": 8, "n_epochs": 1, "minibatch_size": 16}),
    "dqn": (dqn, {"n_timesteps": 8, "learning_starts": 16, "updates_per_batch": 2,
                  "batch_size": 8, "buffer_size": 256}),
    "impala": (impala, {"n_timesteps": 8}),  # IMPALA and APPO: a pipelined Batcher (a process)
    "appo": (appo, {"n_timesteps": 8, "n_epochs": 1, "minibatch_size": 16}),
    "sac": (sac, {"n_timesteps": 8, "learning_starts": 16, "batch_size": 8, "buffer_size": 256}),
    "trpo": (trpo, {"n_timesteps": 8, "critic_epochs": 1, "minibatch_size": 16, "cg_iters": 2}),
}


def weights_batchers_start_with(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, torch.Tensor]]:
    """The weights each training batcher is built with: a SerialBatcher's own agent's, or the
    model a process Batcher's workers receive (they collect their first segments with it)."""
    seen: list[dict[str, torch.Tensor]] = []
    make = run_module.make_batcher

    def recording(**kwargs: Any) -> Any:
        batcher = make(**kwargs)
        model = batcher.agent.model if isinstance(batcher, SerialBatcher) \
            else kwargs["agent_args"]["model"]
        seen.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        return batcher

    monkeypatch.setattr(run_module, "make_batcher", recording)
    return seen


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k].cpu()) for k in a)


PIPELINED = ("impala", "appo")  # they need --pipeline 2: one worker process


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.slow) if name in PIPELINED
                                  else name for name in sorted(SMALL)])
def test_the_first_segment_after_a_resume_is_collected_with_the_checkpoints_weights(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    module, small = SMALL[name]
    frames = 64 if name == "reinforce" else 48  # REINFORCE: 2 episodes an iteration

    def config(max_frames: int, **kw: Any) -> Any:
        return module.Config(
            layout=LayoutConfig(learner_device="cpu", n_processes=1, n_envs=2,
                                pipeline=2 if name in PIPELINED else 1), hidden=16,
            eval_every=0, target_return=None, checkpoint_every=1, max_frames=max_frames,
            runs_dir=str(tmp_path), **small, **kw)

    seen = weights_batchers_start_with(monkeypatch)
    run_dir = Path(module.main(config(frames))["run_dir"])
    built = seen[0]  # the seeded, untrained model's weights
    saved = torch.load(run_dir / "checkpoints" / "latest.pt")["model"]
    assert not same(built, saved), "the first session learned nothing: the test shows nothing"
    seen.clear()
    summary = module.main(config(2 * frames, resume=str(run_dir)))
    assert summary["resumes"] == 1 and len(seen) == 1
    assert same(seen[0], saved), f"{name}: the first segment after the resume was collected " \
                                 "with other weights than the checkpoint's"
