"""Tests of rlstruct.blocks.functional.clipped_surrogate (APPO's and PPO's objective): known
answers, a python reference written from the case analysis of the paper, the gradient, errors."""

from __future__ import annotations

import math

import pytest
import torch

from rlstruct.blocks.functional import clipped_surrogate
from rlstruct.errors import ConfigError, ShapeError

# The `device` fixture (cpu, plus cuda when available) comes from tests/conftest.py.


def ref_surrogate(logp: list[float], logp_old: list[float], adv: list[float], eps: float):
    """Per sample, from the cases of Schulman et al. (2017), fig. 1, rather than from min():
    for A > 0 the objective is r A capped at (1 + eps) A; for A < 0 it is r A capped at
    (1 - eps) A (it never rewards pushing r below 1 - eps); for A = 0 it is 0."""
    out = []
    for lp, lo, a in zip(logp, logp_old, adv, strict=True):
        r = math.exp(lp - lo)
        if a > 0:
            objective = min(r, 1 + eps) * a
        elif a < 0:
            objective = max(r, 1 - eps) * a
        else:
            objective = 0.0
        out.append(-objective)
    return out


def test_known_answers(device):
    # ratios 1.5, 1.5, 0.5, 0.5, 1.1 with eps 0.2 and A = 2, -2, 2, -2, 3:
    # -min(3, 2.4), -min(-3, -2.4), -min(1, 1.6), -min(-1, -1.6), -min(3.3, 3.3)
    logp_old = torch.zeros(5, dtype=torch.float64, device=device)
    logp = torch.tensor([1.5, 1.5, 0.5, 0.5, 1.1], dtype=torch.float64, device=device).log()
    adv = torch.tensor([2.0, -2.0, 2.0, -2.0, 3.0], dtype=torch.float64, device=device)
    out = clipped_surrogate(logp, logp_old, adv, 0.2)
    expected = torch.tensor([-2.4, 3.0, -1.0, 1.6, -3.3], dtype=torch.float64)
    torch.testing.assert_close(out.cpu(), expected)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("eps", [0.1, 0.2, 0.5])
def test_matches_the_reference(seed, eps, device):
    g = torch.Generator().manual_seed(seed)
    logp_old = -torch.rand(3, 17, generator=g, dtype=torch.float64) * 2
    logp = logp_old + torch.randn(3, 17, generator=g, dtype=torch.float64) * 0.5
    adv = torch.randn(3, 17, generator=g, dtype=torch.float64)
    adv[0, :3] = 0.0
    out = clipped_surrogate(logp.to(device), logp_old.to(device), adv.to(device), eps)
    assert out.shape == (3, 17)
    expected = [ref_surrogate(a, b, c, eps) for a, b, c in
                zip(logp.tolist(), logp_old.tolist(), adv.tolist(), strict=True)]
    torch.testing.assert_close(out.cpu(), torch.tensor(expected, dtype=torch.float64))


def test_gradient_vanishes_past_the_trust_region_and_flows_inside_it():
    logp_old = torch.zeros(4)
    # ratio 1.5 with A > 0 and 0.5 with A < 0: past the region, no gradient;
    # ratio 0.5 with A > 0 and 1.5 with A < 0: the harmful direction is never clipped.
    logp = torch.tensor([1.5, 0.5, 0.5, 1.5]).log().requires_grad_()
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0], requires_grad=True)
    clipped_surrogate(logp, logp_old, adv, 0.2).sum().backward()
    assert logp.grad is not None
    torch.testing.assert_close(logp.grad, torch.tensor([0.0, 0.0, -0.5, 1.5]))  # -r A
    assert adv.grad is None  # advantages are constants


def test_errors():
    x = torch.zeros(3)
    with pytest.raises(ShapeError, match=r"advantage has shape \(2,\), expected \(3,\) like logp"):
        clipped_surrogate(x, x, torch.zeros(2), 0.2)
    with pytest.raises(ShapeError, match="logp_old has shape"):
        clipped_surrogate(x, torch.zeros(3, 1), x, 0.2)
    for bad in (0.0, 1.0, -0.1, float("nan")):
        with pytest.raises(ConfigError, match="clip must be in \\(0, 1\\)"):
            clipped_surrogate(x, x, x, bad)
