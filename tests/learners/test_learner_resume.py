"""``--resume`` with ``--n-learners 2``: a PPO run checkpoints, is resumed, and every rank of the
resumed learner group holds the checkpoint's weights and optimizer state (loaded before the
ranks start, and again into running ranks), the ranks agreeing bitwise."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

# Runs in a subprocess: resumes the run, builds the group from a *fresh* model (so only the
# load can give the ranks the checkpoint's state) and learns with a probe that reports, from
# every rank, sums of its weights and optimizer state and their spread over the ranks.
PROBE = textwrap.dedent("""
    import json, sys
    from functools import partial

    import torch
    import torch.distributed as dist

    from rlstruct.algos import ppo
    from rlstruct import DictTensor
    from rlstruct.runs.layout import LayoutConfig
    from rlstruct.blocks.optim import adam
    from rlstruct.runs.run import Run

    def probe(model, optimizer, batch, cfg, step):
        state = optimizer.state_dict()["state"]
        values = torch.tensor([
            sum(float(v.double().sum()) for v in model.state_dict().values()),
            sum(float(s["exp_avg"].double().sum()) for s in state.values()),
            sum(float(s["exp_avg_sq"].double().sum()) for s in state.values()),
            float(state[0]["step"]),
        ], dtype=torch.float64)
        high, low = values.clone(), values.clone()
        dist.all_reduce(high, op=dist.ReduceOp.MAX)
        dist.all_reduce(low, op=dist.ReduceOp.MIN)
        out = dict(zip(["weights", "exp_avg", "exp_avg_sq", "step"], values.tolist()))
        return {**out, "spread": float((high - low).max()), "rank": float(dist.get_rank())}

    if __name__ == "__main__":  # the forkserver imports this script too
        cfg = ppo.Config(layout=LayoutConfig(learner_device="cpu", n_learners=2, n_processes=2,
                                             n_envs=2), eval_every=0, max_frames=1024,
                         resume=sys.argv[1])
        checkpoint = torch.load(sys.argv[1] + "/checkpoints/latest.pt", weights_only=False)
        batch = DictTensor({"x": torch.zeros(4, 1)})
        with Run("ppo", cfg) as run:
            make_model = ppo.model_factory(run, cfg)
            fresh = make_model()
            group = run.learner_group(make_model, fresh, partial(adam, lr=cfg.lr, eps=1e-5),
                                      probe, lambda model: model)  # loads the checkpoint
            first = group.learn(batch)
            zeros = {k: torch.zeros_like(v) for k, v in checkpoint["model"].items()}
            group.load_state_dict(zeros)
            group.optimizer.load_state_dict(checkpoint["optimizer"])
            second = group.learn(batch)  # running ranks: zero weights, the saved optimizer
            published = {k: float(v.double().sum()) for k, v in group.state_dict().items()}
        fresh = sum(float(v.double().sum()) for v in fresh.state_dict().values())
        print("PROBE " + json.dumps({"first": first, "second": second, "published": published,
                                     "fresh": fresh}))
""")


def _python(args: list[str], cwd: Path, timeout: float) -> str:
    """Runs ``python *args`` in its own session; kills whatever of it is left."""
    proc = subprocess.Popen([sys.executable, *args], cwd=cwd, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out = proc.communicate(timeout=timeout)[0]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)
    assert proc.returncode == 0, out
    return out


@pytest.mark.timeout(400)
def test_a_resumed_ppo_run_loads_the_checkpoint_into_every_learner_rank(tmp_path):
    out = _python(["-m", "rlstruct.algos.ppo", "--n-learners", "2", "--learner-device", "cpu",
                   "--max-frames", "512", "--eval-every", "0", "--n-processes", "2",
                   "--n-envs", "2"], tmp_path, timeout=180)
    run_dir = tmp_path / out.split("outputs in ", 1)[1].splitlines()[0].strip()
    checkpoint = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=False)
    state = checkpoint["optimizer"]["state"]
    assert float(state[0]["step"]) >= 1  # rank 0's optimizer learned before the checkpoint
    expected = {
        "weights": sum(float(v.double().sum()) for v in checkpoint["model"].values()),
        "exp_avg": sum(float(s["exp_avg"].double().sum()) for s in state.values()),
        "exp_avg_sq": sum(float(s["exp_avg_sq"].double().sum()) for s in state.values()),
        "step": float(state[0]["step"]),
    }
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    out = _python([str(script), str(run_dir)], tmp_path, timeout=180)
    result = json.loads(out.split("PROBE ", 1)[1].splitlines()[0])
    first, second = result["first"], result["second"]
    for key, value in expected.items():  # the ranks started from the checkpoint
        assert first[key] == pytest.approx(value, rel=1e-9, abs=1e-9), key
    assert first["spread"] == 0.0 and first["rank"] == 0.5  # both ranks, identical
    assert second["weights"] == 0.0 and second["spread"] == 0.0  # loaded into running ranks
    for key in ("exp_avg", "exp_avg_sq", "step"):
        assert second[key] == pytest.approx(expected[key], rel=1e-9, abs=1e-9), key
    assert sum(result["published"].values()) == 0.0  # state_dict() is what was loaded
    assert abs(result["fresh"] - expected["weights"]) > 1e-3  # the group's init_state was not
