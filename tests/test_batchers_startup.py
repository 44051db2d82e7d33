"""The first Batcher of a program overlaps its workers' start with the learner's lazy imports.

``torch.optim``'s first optimizer imports ``torch._dynamo`` (about a second on one core);
``worker_context(start=True)`` imports it in a background thread while the forkserver starts.
Each check runs in a fresh interpreter (this one has imported everything already), with a
timeout, so a deadlock between the two imports fails the test instead of hanging it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

TIMEOUT_S = 120


def run_fresh(code: str) -> subprocess.CompletedProcess:
    """Runs ``code`` in a new interpreter; its process group is ended by the timeout."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=TIMEOUT_S)


def test_worker_context_imports_dynamo_in_a_background_thread_once():
    done = run_fresh("""
        import sys
        from rlstruct.batchers import processes
        assert "torch._dynamo" not in sys.modules, "imported before the forkserver starts"
        processes.worker_context(start=True)
        thread = processes._preload_thread
        assert thread is not None and thread.daemon, thread
        thread.join(60)
        assert not thread.is_alive(), "the background import took more than 60 s"
        assert "torch._dynamo" in sys.modules
        processes.worker_context(start=True)
        assert processes._preload_thread is thread, "a second thread was started"
        print("ok")
    """)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok"


@pytest.mark.slow
def test_the_batcher_leaves_no_preload_thread_and_the_optimizer_follows():
    """A user's script builds its optimizer right after the Batcher: the constructor has waited
    for the background import (no thread of its making outlives it), and the optimizer is
    built."""
    done = run_fresh("""
        import threading
        import torch
        from rlstruct.batchers import Batcher, processes
        from rlstruct.envs import GymEnvInf
        from rlstruct.nets import MLPActorCritic
        from rlstruct.sampling import ActorAgent

        if __name__ == "__main__":
            model = MLPActorCritic(4, 2, 16)
            batcher = Batcher(4, ActorAgent, {"model": model}, GymEnvInf,
                              {"env": "CartPole-v1", "n_envs": 2}, n_processes=2)
            try:
                assert processes._preload_thread is not None
                assert not processes._preload_thread.is_alive(), "the preload outlived start"
                names = [t.name for t in threading.enumerate()]
                assert "rlstruct-preload" not in names, names
                optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
                batcher.reset()
                batcher.execute()
                traj, _ = batcher.get()
                assert tuple(traj.lengths.shape) == (4,), traj.lengths.shape
            finally:
                batcher.close()
            print("ok", type(optimizer).__name__)
    """)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok Adam"
