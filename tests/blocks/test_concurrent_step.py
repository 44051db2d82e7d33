"""rlstruct.blocks.optim.concurrent_step: the losses of disjoint parameters back-propagated at
once in two threads make the step of one backward through their sum (clipping included), under
the caller's autocast, and a loss that fails in the pool fails the step before it is taken."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from rlstruct.blocks.optim import concurrent_step, gradient_step


def _models_and_losses(x: torch.Tensor):
    torch.manual_seed(0)
    a, b = torch.nn.Linear(4, 3), torch.nn.Linear(4, 2)
    return (a, b), [lambda: (a(x).pow(2).sum(), "a"), lambda: ((b(x) - 1).abs().sum(), "b")]


@pytest.mark.parametrize("max_grad_norm", [0.0, 0.5])
def test_the_step_is_the_summed_losses_step(max_grad_norm: float):
    x = torch.randn(8, 4)
    (a1, b1), losses1 = _models_and_losses(x)
    (a2, b2), losses2 = _models_and_losses(x)
    opt1 = torch.optim.SGD([*a1.parameters(), *b1.parameters()], lr=0.1)
    opt2 = torch.optim.SGD([*a2.parameters(), *b2.parameters()], lr=0.1)
    with ThreadPoolExecutor(1) as pool:
        for _ in range(3):
            gradient_step(opt1, losses1[0]()[0] + losses1[1]()[0], max_grad_norm)
            assert concurrent_step(opt2, losses2, pool, max_grad_norm) == ["a", "b"]
    for p, q in zip([*a1.parameters(), *b1.parameters()], [*a2.parameters(), *b2.parameters()]):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-7)
    assert not torch.equal(a2.weight, _models_and_losses(x)[0][0].weight)  # it did step


def test_the_pool_thread_runs_under_the_callers_autocast():
    seen = []

    def loss(name: str):
        seen.append((name, torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        w = torch.nn.Parameter(torch.ones(2, 2))
        return (torch.ones(1, 2) @ w).float().sum(), w

    with ThreadPoolExecutor(1) as pool:
        w1, w2 = torch.nn.Parameter(torch.ones(1)), torch.nn.Parameter(torch.ones(1))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            concurrent_step(torch.optim.SGD([w1, w2], lr=0.1),
                            [lambda: (w1.sum(), loss("main")), lambda: (w2.sum(), loss("pool"))],
                            pool, 0.0)
        concurrent_step(torch.optim.SGD([w1, w2], lr=0.1),
                        [lambda: (w1.sum(), loss("main")), lambda: (w2.sum(), loss("pool"))],
                        pool, 0.0)
    # The two threads record in either order.
    assert sorted(seen[:2]) == [(n, True, torch.bfloat16) for n in ("main", "pool")]
    assert sorted(name for name, _, _ in seen[2:]) == ["main", "pool"]
    assert [enabled for _, enabled, _ in seen[2:]] == [False, False]


def test_a_loss_failing_in_the_pool_fails_the_step_before_it_is_taken():
    w1, w2 = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))

    def bad():
        raise ValueError("the policy loss broke")

    with ThreadPoolExecutor(1) as pool, pytest.raises(ValueError, match="policy loss broke"):
        concurrent_step(torch.optim.SGD([w1, w2], lr=1.0), [lambda: (w1.sum(), 0), bad], pool,
                        0.0)
    assert torch.equal(w1, torch.ones(2)) and torch.equal(w2, torch.ones(2))


def test_a_loss_failing_in_the_callers_thread_waits_for_the_pools_before_it_raises():
    w1, w2, finished = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2)), []

    def bad():
        raise ValueError("the critic loss broke")

    def slow():
        time.sleep(0.3)
        finished.append(True)
        return w2.sum(), 1

    with ThreadPoolExecutor(1) as pool, pytest.raises(ValueError, match="critic loss broke"):
        concurrent_step(torch.optim.SGD([w1, w2], lr=1.0), [bad, slow], pool, 0.0)
    assert finished == [True] and w2.grad is not None  # it ran to its end before the raise
    assert torch.equal(w1, torch.ones(2)) and torch.equal(w2, torch.ones(2))  # no step
