"""Tests of rlstruct.blocks.functional.vtrace: known answers, python reference, GAE(1) identity,
errors."""

from __future__ import annotations

import math

import pytest
import torch

from rlstruct.blocks.functional import VTrace, gae, valid_mask, vtrace
from rlstruct.errors import ConfigError, ShapeError

GARBAGE = 1e9
INF = float("inf")

# The `device` fixture (cpu, plus cuda when available) comes from tests/conftest.py.


def close(a: torch.Tensor, b: torch.Tensor | list, tol: float = 1e-9) -> None:
    if isinstance(b, list):
        b = torch.tensor(b, dtype=torch.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    torch.testing.assert_close(a.cpu().double(), b.cpu().double(), atol=tol, rtol=tol)


# ----------------------------------------------------------------------------------------------
# Plain python reference, per row and per step, written from the paper's closed form
#   v_t = V_t + sum_{s=t}^{e} gamma^(s-t) (prod_{i=t}^{s-1} c_i) delta_s
# where e is the episode's last step in the row (done, or the row's last valid step), rather than
# from the backward recursion the implementation uses.


def ref_vtrace(r, v, nv, term, trunc, log_rho, lengths, gamma, rho_bar, c_bar):
    nb, nt = len(r), len(r[0])
    targets = [[0.0] * nt for _ in range(nb)]
    advantages = [[0.0] * nt for _ in range(nb)]
    for b in range(nb):
        n = lengths[b]
        ratio = [math.exp(x) for x in log_rho[b][:n]]
        rho = [min(rho_bar, x) for x in ratio]
        c = [min(c_bar, x) for x in ratio]
        boot = [0.0 if term[b][t] else nv[b][t] for t in range(n)]
        delta = [rho[t] * (r[b][t] + gamma * boot[t] - v[b][t]) for t in range(n)]
        ends = [bool(term[b][t] or trunc[b][t]) or t == n - 1 for t in range(n)]
        for t in range(n):
            total, weight, s = 0.0, 1.0, t
            while True:
                total += weight * delta[s]
                if ends[s]:
                    break
                weight *= gamma * c[s]
                s += 1
            targets[b][t] = v[b][t] + total
        for t in range(n):
            q = boot[t] if ends[t] else targets[b][t + 1]
            advantages[b][t] = rho[t] * (r[b][t] + gamma * q - v[b][t])
    return targets, advantages


def random_batch(seed: int, nb: int = 6, nt: int = 7, consistent: bool = False):
    """Random segment, log-ratios spread so that clipping happens; garbage (1e9) in padding.

    ``consistent``: V'_t == V_{t+1} inside every episode (else on about 70% of the steps).
    """
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, nt + 1, (nb,), generator=g)
    lengths[0], lengths[1] = 0, nt
    r = torch.randn(nb, nt, generator=g, dtype=torch.float64)
    v = torch.randn(nb, nt, generator=g, dtype=torch.float64)
    nv = torch.randn(nb, nt, generator=g, dtype=torch.float64)
    # A rollout gives V'_t == V_{t+1} inside an episode; keep it so for most steps.
    same = torch.rand(nb, nt - 1, generator=g) < 0.7
    log_rho = torch.randn(nb, nt, generator=g, dtype=torch.float64)
    term = torch.rand(nb, nt, generator=g) < 0.2
    trunc = torch.rand(nb, nt, generator=g) < 0.2
    if consistent:
        same = ~(term[:, :-1] | trunc[:, :-1])
    nv[:, :-1] = torch.where(same, v[:, 1:], nv[:, :-1])
    pad = ~valid_mask(lengths, nt)
    for x in (r, v, nv, log_rho):
        x[pad] = GARBAGE
    term[pad] = True
    trunc[pad] = True
    return r, v, nv, term, trunc, lengths, log_rho


def lists(*xs):
    return [x.tolist() for x in xs]


SEEDS = [0, 1, 2, 3, 4, 5]


# ----------------------------------------------------------------------------------------------
# Known answers, worked out by hand. gamma = 0.5, rho_bar = 1, c_bar = 0.5.
#   row 0: r = 1 2 3 4, V = 1, V' = 1 (garbage at t=1) 1 2, terminated at t=1, cut at t=3,
#          ratios 2 0.5 1 4 -> rho = 1 0.5 1 1, c = 0.5 0.5 0.5 0.5
#          delta = 1*(1 + 0.5 - 1) = 0.5, 0.5*(2 - 1) = 0.5, 3 + 0.5 - 1 = 2.5, 4 + 1 - 1 = 4
#          v3 = 1 + 4 = 5; v2 = 1 + 2.5 + 0.5*0.5*4 = 4.5; v1 = 1 + 0.5 = 1.5 (episode end);
#          v0 = 1 + 0.5 + 0.5*0.5*0.5 = 1.625
#          A0 = 1*(1 + 0.5*v1 - 1) = 0.75, A1 = 0.5*(2 + 0 - 1) = 0.5 (terminated),
#          A2 = 3 + 0.5*v3 - 1 = 4.5, A3 = 4 + 0.5*V'_3 - 1 = 4 (segment cut)
#   row 1: lengths 2, r = 1 2, V = 1 1, truncated at t=0 with V'_0 = 6, V'_1 = 2, ratios 0.5 0.25
#          v0 = 1 + 0.5*(1 + 3 - 1) = 2.5 (no recursion past a truncation);
#          v1 = 1 + 0.25*(2 + 1 - 1) = 1.5; A0 = 1.5 (bootstraps V'_0, not v1), A1 = 0.5
#   row 2: lengths 0 -> all 0 (everything is garbage, log-ratios included).


def known_case(device, dtype=torch.float64):
    big = GARBAGE
    r = torch.tensor([[1.0, 2, 3, 4], [1, 2, big, big], [big] * 4], dtype=dtype)
    v = torch.tensor([[1.0, 1, 1, 1], [1, 1, big, big], [big] * 4], dtype=dtype)
    nv = torch.tensor([[1.0, big, 1, 2], [6, 2, big, big], [big] * 4], dtype=dtype)
    ratio = torch.tensor([[2.0, 0.5, 1, 4], [0.5, 0.25, 1, 1], [1, 1, 1, 1]], dtype=dtype)
    log_rho = ratio.log()
    log_rho[1, 2:] = big
    log_rho[2] = big
    term = torch.zeros(3, 4, dtype=torch.bool)
    trunc = torch.zeros(3, 4, dtype=torch.bool)
    term[0, 1] = True
    trunc[1, 0] = True
    term[1, 2:] = True  # flags in padding must be ignored too
    trunc[2] = True
    lengths = torch.tensor([4, 2, 0])
    return [x.to(device) for x in (r, v, nv, term, trunc, lengths, log_rho)]


EXPECTED_TARGETS = [[1.625, 1.5, 4.5, 5.0], [2.5, 1.5, 0.0, 0.0], [0.0] * 4]
EXPECTED_ADVANTAGES = [[0.75, 0.5, 4.5, 4.0], [1.5, 0.5, 0.0, 0.0], [0.0] * 4]


def test_vtrace_known(device):
    r, v, nv, term, trunc, lengths, log_rho = known_case(device)
    out = vtrace(r, v, nv, term, trunc, lengths, log_rho, 0.5, rho_bar=1.0, c_bar=0.5)
    assert isinstance(out, VTrace)
    assert out.targets.device.type == device.type
    close(out.targets, EXPECTED_TARGETS)
    close(out.advantages, EXPECTED_ADVANTAGES)
    targets, advantages = out  # a plain tuple too
    assert targets is out.targets and advantages is out.advantages
    # c_bar = 1 changes the traces only: v2 = 1 + 2.5 + 0.5*1*4 = 5.5, v0 = 1 + 0.5 + 0.25 = 1.75
    # and so A0 = 1 + 0.75 - 1 = 0.75 still (it reads v1, which is an episode end).
    out = vtrace(r, v, nv, term, trunc, lengths, log_rho, 0.5, rho_bar=1.0, c_bar=1.0)
    close(out.targets, [[1.75, 1.5, 5.5, 5.0], [2.5, 1.5, 0.0, 0.0], [0.0] * 4])
    close(out.advantages, EXPECTED_ADVANTAGES)


def test_vtrace_matches_reference_on_known_case():
    r, v, nv, term, trunc, lengths, log_rho = known_case("cpu")
    ref_t, ref_a = ref_vtrace(
        *lists(r, v, nv, term, trunc, log_rho), lengths.tolist(), 0.5, 1.0, 0.5
    )
    close(torch.tensor(ref_t), EXPECTED_TARGETS)
    close(torch.tensor(ref_a), EXPECTED_ADVANTAGES)


# ----------------------------------------------------------------------------------------------
# Equality with the python reference on random data.


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("gamma", [0.0, 0.9, 1.0])
@pytest.mark.parametrize(
    ("rho_bar", "c_bar"), [(1.0, 1.0), (0.5, 0.3), (0.8, 1.0), (INF, 0.9), (2.0, 2.0)]
)
def test_vtrace_reference(seed, gamma, rho_bar, c_bar, device):
    r, v, nv, term, trunc, lengths, log_rho = (x.to(device) for x in random_batch(seed))
    out = vtrace(r, v, nv, term, trunc, lengths, log_rho, gamma, rho_bar, c_bar)
    ref_t, ref_a = ref_vtrace(
        *lists(r, v, nv, term, trunc, log_rho), lengths.tolist(), gamma, rho_bar, c_bar
    )
    close(out.targets, ref_t)
    close(out.advantages, ref_a)


def test_vtrace_reference_clips_something():
    """The random data above really exercises both clips (the reference test is not vacuous)."""
    r, v, nv, term, trunc, lengths, log_rho = random_batch(0)
    valid = valid_mask(lengths, r.shape[1])
    ratio = log_rho[valid].exp()
    assert (ratio > 1.0).sum() >= 5 and (ratio < 0.5).sum() >= 3
    clipped = vtrace(r, v, nv, term, trunc, lengths, log_rho, 0.9, 0.5, 0.3)
    free = vtrace(r, v, nv, term, trunc, lengths, log_rho, 0.9, INF, INF)
    assert not torch.allclose(clipped.targets, free.targets)
    assert not torch.allclose(clipped.advantages, free.advantages)


# ----------------------------------------------------------------------------------------------
# Identities.


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("rho_bar", "c_bar"), [(1.0, 1.0), (1.5, 3.0), (INF, INF)])
def test_vtrace_on_policy_is_gae_lambda_1(seed, rho_bar, c_bar, device):
    # The targets are GAE(1)'s returns on any data ...
    r, v, nv, term, trunc, lengths, _ = (x.to(device) for x in random_batch(seed))
    log_rho = torch.where(valid_mask(lengths, r.shape[1]), 0.0, GARBAGE).to(r)
    out = vtrace(r, v, nv, term, trunc, lengths, log_rho, 0.9, rho_bar, c_bar)
    adv, ret = gae(r, v, nv, term, trunc, lengths, 0.9, 1.0)
    close(out.targets, ret)
    # ... and the advantages GAE(1)'s advantages where V'_t == V_{t+1} inside episodes (rollouts).
    r, v, nv, term, trunc, lengths, _ = (x.to(device) for x in random_batch(seed, consistent=True))
    log_rho = torch.where(valid_mask(lengths, r.shape[1]), 0.0, GARBAGE).to(r)
    out = vtrace(r, v, nv, term, trunc, lengths, log_rho, 0.9, rho_bar, c_bar)
    adv, ret = gae(r, v, nv, term, trunc, lengths, 0.9, 1.0)
    close(out.targets, ret)
    close(out.advantages, adv)


@pytest.mark.parametrize("seed", SEEDS)
def test_vtrace_ratios_above_the_bars_are_on_policy(seed):
    """With bars 1, any ratio >= 1 is clipped to 1: the same as on-policy data, i.e. GAE(1)."""
    r, v, nv, term, trunc, lengths, log_rho = random_batch(seed, consistent=True)
    out = vtrace(r, v, nv, term, trunc, lengths, log_rho.abs() + 0.1, 0.95)
    adv, ret = gae(r, v, nv, term, trunc, lengths, 0.95, 1.0)
    close(out.targets, ret)
    close(out.advantages, adv)
    # ... while ratios below 1 change both outputs.
    out = vtrace(r, v, nv, term, trunc, lengths, -log_rho.abs() - 0.1, 0.95)
    valid = valid_mask(lengths, r.shape[1])
    assert not torch.allclose(out.targets[valid], ret[valid])
    assert not torch.allclose(out.advantages[valid], adv[valid])


# ----------------------------------------------------------------------------------------------
# Padding, dtypes, devices, flags, autograd, empty shapes.


def test_vtrace_padding_is_zero_even_with_nan_and_inf(device):
    r, v, nv, term, trunc, lengths, log_rho = (x.to(device) for x in random_batch(11))
    pad = ~valid_mask(lengths, r.shape[1])
    assert pad.any()
    ok = vtrace(r, v, nv, term, trunc, lengths, log_rho, 0.9, 0.9, 0.8)
    assert (ok.targets[pad] == 0).all() and (ok.advantages[pad] == 0).all()
    for x, bad in ((r, INF), (v, float("nan")), (nv, float("nan")), (log_rho, float("nan"))):
        x[pad] = bad
    out = vtrace(r, v, nv, term, trunc, lengths, log_rho, 0.9, 0.9, 0.8)
    assert torch.isfinite(out.targets).all() and torch.isfinite(out.advantages).all()
    close(out.targets, ok.targets)
    close(out.advantages, ok.advantages)
    # A huge log-ratio in padding (exp overflows to inf) is harmless as well.
    log_rho[pad] = 1e4
    out = vtrace(r, v, nv, term, trunc, lengths, log_rho, 0.9, INF, INF)
    assert torch.isfinite(out.targets).all() and torch.isfinite(out.advantages).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_vtrace_dtype_and_device_follow_inputs(dtype, device):
    r, v, nv, term, trunc, lengths, log_rho = random_batch(3)
    r, v, nv, log_rho = (x.to(device, dtype) for x in (r, v, nv, log_rho))
    term, trunc, lengths = term.to(device), trunc.to(device), lengths.to(device)
    out = vtrace(r, v, nv, term, trunc, lengths, log_rho, 0.9, 0.9, 0.9)
    for x in out:
        assert x.dtype == dtype
        assert x.device.type == device.type
        assert x.shape == r.shape
    ref = vtrace(*(x.double().cpu() for x in (r, v, nv)), term.cpu(), trunc.cpu(),
                 lengths.cpu(), log_rho.double().cpu(), 0.9, 0.9, 0.9)  # fmt: skip
    close(out.targets, ref.targets, tol=1e-4)
    # float32 log-ratios with float64 values promote to float64.
    out = vtrace(r.double(), v.double(), nv.double(), term, trunc, lengths, log_rho.float(), 0.9)
    assert out.targets.dtype == torch.float64 and out.advantages.dtype == torch.float64


def test_vtrace_flags_as_numbers_match_bool():
    r, v, nv, term, trunc, lengths, log_rho = random_batch(5)
    ref = vtrace(r, v, nv, term, trunc, lengths, log_rho, 0.9, 0.7, 0.6)
    for conv in (lambda x: x.float(), lambda x: x.long(), lambda x: x.to(torch.uint8)):
        out = vtrace(r, v, nv, conv(term), conv(trunc), lengths, log_rho, 0.9, 0.7, 0.6)
        close(out.targets, ref.targets)
        close(out.advantages, ref.advantages)


def test_vtrace_outputs_carry_no_grad_and_inputs_are_untouched():
    r, v, nv, term, trunc, lengths, log_rho = random_batch(2)
    valid = valid_mask(lengths, r.shape[1])
    v = torch.where(valid, v, 0).requires_grad_()
    log_rho = torch.where(valid, log_rho, 0).requires_grad_()
    before = [x.detach().clone() for x in (r, v, nv, log_rho)]
    out = vtrace(r, v, nv, term, trunc, lengths, log_rho, 0.9, 0.8, 0.8)
    assert torch.is_grad_enabled()
    for x in out:
        assert not x.requires_grad and x.grad_fn is None
    for x, b in zip((r, v, nv, log_rho), before):
        assert torch.equal(x.detach(), b)
    with torch.no_grad():
        again = vtrace(r, v, nv, term, trunc, lengths, log_rho, 0.9, 0.8, 0.8)
    close(again.targets, out.targets)
    # The usual use: targets are constants in a loss that still differentiates value.
    loss = ((v - out.targets) ** 2).sum()
    loss.backward()
    assert v.grad is not None and v.grad[valid].abs().sum() > 0


def test_vtrace_empty_time_and_batch():
    for nb, nt in [(3, 0), (0, 4)]:
        x = torch.zeros(nb, nt)
        f = torch.zeros(nb, nt, dtype=torch.bool)
        out = vtrace(x, x, x, f, f, torch.zeros(nb, dtype=torch.long), x, 0.9)
        assert out.targets.shape == (nb, nt) and out.advantages.shape == (nb, nt)


# ----------------------------------------------------------------------------------------------
# Validation errors.


def _args():
    r = torch.zeros(3, 5)
    f = torch.zeros(3, 5, dtype=torch.bool)
    return r, f, torch.tensor([5, 2, 0])


def test_vtrace_errors_shapes():
    r, f, lens = _args()
    bad = torch.zeros(3, 4)
    with pytest.raises(ShapeError, match=r"^log_rho has shape \(3, 4\), expected \(3, 5\) like"):
        vtrace(r, r, r, f, f, lens, bad, 0.9)
    with pytest.raises(ShapeError, match=r"^value has shape \(3, 4\), expected \(3, 5\) like"):
        vtrace(r, bad, r, f, f, lens, r, 0.9)
    with pytest.raises(ShapeError, match=r"^next_value has shape \(3, 4\)"):
        vtrace(r, r, bad, f, f, lens, r, 0.9)
    with pytest.raises(ShapeError, match=r"^terminated has shape \(3, 4\)"):
        vtrace(r, r, r, bad.bool(), f, lens, r, 0.9)
    with pytest.raises(ShapeError, match=r"^truncated has shape \(5,\)"):
        vtrace(r, r, r, f, f[0], lens, r, 0.9)
    with pytest.raises(ShapeError, match=r"reward must be 2-D \(B, T\), got shape \(5,\)"):
        vtrace(r[0], r[0], r[0], f[0], f[0], lens, r[0], 0.9)
    with pytest.raises(ShapeError, match=r"lengths has shape \(2,\), expected \(3,\)"):
        vtrace(r, r, r, f, f, lens[:2], r, 0.9)
    with pytest.raises(ShapeError, match=r"lengths must lie in \[0, 5\].*max 6"):
        vtrace(r, r, r, f, f, torch.tensor([6, 0, 0]), r, 0.9)


@pytest.mark.parametrize("gamma", [-0.1, 1.5, float("nan")])
def test_vtrace_errors_gamma(gamma):
    r, f, lens = _args()
    with pytest.raises(ConfigError, match=r"gamma must be in \[0, 1\], got"):
        vtrace(r, r, r, f, f, lens, r, gamma)


@pytest.mark.parametrize("name", ["rho_bar", "c_bar"])
@pytest.mark.parametrize("bar", [0.0, -1.0, float("nan")])
def test_vtrace_errors_bars(name, bar):
    r, f, lens = _args()
    with pytest.raises(ConfigError, match=rf"^{name} must be > 0 .*got {bar}"):
        vtrace(r, r, r, f, f, lens, r, 0.9, **{name: bar})
    assert issubclass(ConfigError, ValueError)
