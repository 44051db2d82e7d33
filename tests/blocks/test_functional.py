"""Tests of rlstruct.blocks.functional: known answers, python reference loops, identities,
errors."""

from __future__ import annotations

import pytest
import torch

from rlstruct.blocks.functional import (
    discounted_returns,
    gae,
    masked_mean,
    n_step_returns,
    td_targets,
    valid_mask,
)
from rlstruct.errors import ConfigError, ShapeError

GARBAGE = 1e9

# The `device` fixture (cpu, plus cuda when available) comes from tests/conftest.py.


def close(a: torch.Tensor, b: torch.Tensor | list, tol: float = 1e-9) -> None:
    if isinstance(b, list):
        b = torch.tensor(b, dtype=torch.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    torch.testing.assert_close(a.cpu().double(), b.cpu().double(), atol=tol, rtol=tol)


# ----------------------------------------------------------------------------------------------
# Plain python references: per row, per step, python floats.


def ref_discounted(r, term, trunc, lengths, gamma, nv=None):
    nb, nt = len(r), len(r[0])
    out = [[0.0] * nt for _ in range(nb)]
    for b in range(nb):
        g_next = 0.0
        for t in reversed(range(lengths[b])):
            v = 0.0 if nv is None else nv[b][t]
            if term[b][t]:
                g = r[b][t]
            elif trunc[b][t] or t == lengths[b] - 1:
                g = r[b][t] + gamma * v
            else:
                g = r[b][t] + gamma * g_next
            out[b][t] = g
            g_next = g
    return out


def ref_nstep(r, nv, term, trunc, lengths, gamma, n):
    nb, nt = len(r), len(r[0])
    out = [[0.0] * nt for _ in range(nb)]
    for b in range(nb):
        for t in range(lengths[b]):
            g, disc, s, k = 0.0, 1.0, t, 0
            while True:
                g += disc * r[b][s]
                disc *= gamma
                k += 1
                if term[b][s]:
                    break
                if trunc[b][s] or s == lengths[b] - 1 or k == n:
                    g += disc * nv[b][s]
                    break
                s += 1
            out[b][t] = g
    return out


def ref_gae(r, v, nv, term, trunc, lengths, gamma, lam):
    nb, nt = len(r), len(r[0])
    adv = [[0.0] * nt for _ in range(nb)]
    ret = [[0.0] * nt for _ in range(nb)]
    for b in range(nb):
        a_next = 0.0
        for t in reversed(range(lengths[b])):
            delta = r[b][t] + gamma * (0.0 if term[b][t] else nv[b][t]) - v[b][t]
            last = t == lengths[b] - 1 or term[b][t] or trunc[b][t]
            a = delta if last else delta + gamma * lam * a_next
            adv[b][t] = a
            ret[b][t] = a + v[b][t]
            a_next = a
    return adv, ret


def random_batch(seed: int, nb: int = 6, nt: int = 7, consistent: bool = False):
    """Random segment with garbage (1e9) in padding; lengths include 0 and T."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, nt + 1, (nb,), generator=g)
    lengths[0], lengths[1] = 0, nt
    r = torch.randn(nb, nt, generator=g, dtype=torch.float64)
    v = torch.randn(nb, nt, generator=g, dtype=torch.float64)
    nv = torch.randn(nb, nt, generator=g, dtype=torch.float64)
    term = torch.rand(nb, nt, generator=g) < 0.2
    trunc = torch.rand(nb, nt, generator=g) < 0.2
    if consistent:  # V'_t == V_{t+1} inside an episode (what a real rollout gives).
        nv[:, :-1] = torch.where(term[:, :-1] | trunc[:, :-1], nv[:, :-1], v[:, 1:])
    pad = ~valid_mask(lengths, nt)
    for x in (r, v, nv):
        x[pad] = GARBAGE
    term[pad] = True
    trunc[pad] = True
    return r, v, nv, term, trunc, lengths


def lists(*xs):
    return [x.tolist() for x in xs]


SEEDS = [0, 1, 2, 3, 4]


# ----------------------------------------------------------------------------------------------
# valid_mask / masked_mean


def test_valid_mask(device):
    m = valid_mask(torch.tensor([0, 2, 3], device=device), 3)
    assert m.dtype == torch.bool and m.device.type == device.type
    assert m.cpu().tolist() == [[False] * 3, [True, True, False], [True] * 3]


def test_masked_mean_scalar_and_ignores_masked_nan(device):
    x = torch.tensor([[1.0, 2.0, float("nan")], [6.0, 0.0, 0.0]], device=device)
    m = torch.tensor([[1, 1, 0], [1, 0, 0]], device=device)  # 0/1 ints accepted
    out = masked_mean(x, m)
    assert out.dim() == 0
    close(out, torch.tensor(3.0))  # (1 + 2 + 6) / 3


def test_masked_mean_empty_is_zero(device):
    x = torch.full((2, 3), 5.0, device=device)
    out = masked_mean(x, torch.zeros(2, 3, dtype=torch.bool, device=device))
    assert not torch.isnan(out)
    close(out, torch.tensor(0.0))
    out = masked_mean(x, torch.zeros(2, 3, dtype=torch.bool, device=device), dim=1)
    close(out, torch.zeros(2))


def test_masked_mean_dim_and_broadcast(device):
    x = torch.tensor([[1.0, 3.0, 100.0], [2.0, 4.0, 6.0]], device=device)
    m = torch.tensor([[True, True, False], [False, False, False]], device=device)
    close(masked_mean(x, m, dim=1), torch.tensor([2.0, 0.0]))
    close(masked_mean(x, m, dim=0), torch.tensor([1.0, 3.0, 0.0]))
    close(masked_mean(x, m, dim=1, keepdim=True), torch.tensor([[2.0], [0.0]]))
    col = torch.tensor([True, False, True], device=device)  # broadcasts over rows
    close(masked_mean(x, col, dim=1), torch.tensor([50.5, 4.0]))


# ----------------------------------------------------------------------------------------------
# Known answers, worked out by hand. gamma = 0.5 throughout, rewards 1, 2, 3, 4 per row.
#   row 0: terminated at t=3            -> G3 = 4, G2 = 3 + 2 = 5, G1 = 2 + 2.5 = 4.5,
#                                          G0 = 1 + 2.25 = 3.25
#   row 1: truncated at t=3, V'_3 = 8   -> G3 = 4 + 4 = 8, G2 = 3 + 4 = 7, G1 = 2 + 3.5 = 5.5,
#                                          G0 = 1 + 2.75 = 3.75
#   row 2: no flag, segment cut at t=3 with V'_3 = 8 -> same as row 1
#   row 3: lengths 2 (t=2, 3 padding full of 1e9), cut at t=1 with V'_1 = 6
#                                       -> G1 = 2 + 3 = 5, G0 = 1 + 2.5 = 3.5, G2 = G3 = 0
#   row 4: terminated at t=1 (auto-reset), then cut at t=3 with V'_3 = 8
#                                       -> G1 = 2, G0 = 1 + 1 = 2; G3 = 8, G2 = 3 + 4 = 7
#   row 5: lengths 0                    -> all 0 (everything is garbage)


def known_case(device, dtype=torch.float64):
    big = GARBAGE
    r = torch.tensor([[1.0, 2, 3, 4]] * 5 + [[big] * 4], dtype=dtype)
    r[3, 2:] = big
    nv = torch.tensor(
        [[big] * 4, [0, 0, 0, 8], [0, 0, 0, 8], [0, 6, big, big], [0, big, 0, 8], [big] * 4],
        dtype=dtype,
    )
    term = torch.zeros(6, 4, dtype=torch.bool)
    trunc = torch.zeros(6, 4, dtype=torch.bool)
    term[0, 3] = term[4, 1] = True
    trunc[1, 3] = True
    trunc[3, 2:] = term[3, 2:] = True  # flags in padding must be ignored too
    trunc[5] = True
    lengths = torch.tensor([4, 4, 4, 2, 4, 0])
    return [x.to(device) for x in (r, nv, term, trunc, lengths)]


EXPECTED_G = [
    [3.25, 4.5, 5.0, 4.0],
    [3.75, 5.5, 7.0, 8.0],
    [3.75, 5.5, 7.0, 8.0],
    [3.5, 5.0, 0.0, 0.0],
    [2.0, 2.0, 7.0, 8.0],
    [0.0, 0.0, 0.0, 0.0],
]


def test_discounted_returns_known(device):
    r, nv, term, trunc, lengths = known_case(device)
    out = discounted_returns(r, term, trunc, lengths, 0.5, next_value=nv)
    assert out.device.type == device.type
    close(out, torch.tensor(EXPECTED_G))


def test_discounted_returns_without_next_value_does_not_bootstrap(device):
    # Same rows, V' taken as 0: row 1 -> G3 = 4, G2 = 5, G1 = 4.5, G0 = 3.25 (like row 0);
    # row 3 -> G1 = 2, G0 = 2; row 4 -> G3 = 4, G2 = 5.
    r, _, term, trunc, lengths = known_case(device)
    out = discounted_returns(r, term, trunc, lengths, 0.5)
    expected = [[3.25, 4.5, 5.0, 4.0]] * 3 + [[2.0, 2.0, 0, 0], [2.0, 2.0, 5.0, 4.0], [0.0] * 4]
    close(out, torch.tensor(expected))


def test_td_targets_known(device):
    # r + 0.5 * (1 - term) * V'. Row 1: truncated t=3 still bootstraps: 4 + 4 = 8.
    r, nv, term, trunc, lengths = known_case(device)
    out = td_targets(r, nv, term, trunc, 0.5, lengths=lengths)
    expected = [
        [1 + 0.5 * GARBAGE, 2 + 0.5 * GARBAGE, 3 + 0.5 * GARBAGE, 4],  # row 0: V' is garbage
        [1, 2, 3, 8],
        [1, 2, 3, 8],
        [1, 5, 0, 0],
        [1, 2, 3, 8],
        [0, 0, 0, 0],
    ]
    close(out, torch.tensor(expected, dtype=torch.float64))
    # Without lengths padding is not zeroed (and truncation changes nothing).
    out2 = td_targets(r, nv, term, torch.zeros_like(trunc), 0.5)
    close(out2[:3], out[:3])
    assert out2[5, 0].item() == GARBAGE + 0.5 * GARBAGE


def test_n_step_known(device):
    # n = 2 on the known rows (gamma 0.5), row 0 with V'_0..2 set to 0:
    #   row 0: t0 = 1 + 0.5*2 + 0.25*0 = 2, t1 = 2 + 1.5 + 0 = 3.5,
    #          t2 = 3 + 0.5*4 = 5 (terminated at t3: no bootstrap), t3 = 4
    #   row 1: t0 = 1 + 0.5*2 + 0.25*0 = 2, t1 = 2 + 1.5 + 0 = 3.5, t2 = 3 + 2 + 0.25*8 = 7,
    #          t3 = 4 + 0.5*8 = 8
    #   row 3: t0 = 1 + 1 + 0.25*6 = 3.5, t1 = 2 + 3 = 5
    #   row 4: t0 = 1 + 1 (terminated at t1, no bootstrap) = 2, t1 = 2, t2 = 3 + 2 + 2 = 7, t3 = 8
    r, nv, term, trunc, lengths = known_case(device)
    nv[0, :3] = 0.0
    out = n_step_returns(r, nv, term, trunc, lengths, 0.5, 2)
    expected = [
        [2, 3.5, 5, 4],
        [2, 3.5, 7, 8],
        [2, 3.5, 7, 8],
        [3.5, 5, 0, 0],
        [2, 2, 7, 8],
        [0, 0, 0, 0],
    ]
    close(out, torch.tensor(expected, dtype=torch.float64))


def test_gae_known(device):
    # Row 0 (gamma 0.5, lam 1): r = 1, 2, 3, 4, V = 1 everywhere, V'_t = V_{t+1} = 1, terminated
    # at t=3. deltas: 1 + 0.5 - 1 = 0.5, 2 - 0.5 = 1.5, 3 - 0.5 = 2.5, 4 - 1 = 3.
    #   A3 = 3, A2 = 2.5 + 1.5 = 4, A1 = 1.5 + 2 = 3.5, A0 = 0.5 + 1.75 = 2.25
    #   returns = A + 1 = 3.25, 4.5, 5, 4  (= Monte-Carlo returns of row 0 above)
    # Row 1: done (truncated) at t=1 with V'_1 = 9, then cut at t=2 (lengths 3), V'_2 = 2,
    # t=3 padding with garbage. deltas: t0 = 1 + 0.5 - 1 = 0.5, t1 = 2 + 4.5 - 1 = 5.5,
    # t2 = 3 + 1 - 1 = 3.  A2 = 3, A1 = 5.5 (stops at done), A0 = 0.5 + 0.5 * 5.5 = 3.25.
    r = torch.tensor([[1.0, 2, 3, 4], [1, 2, 3, GARBAGE]], device=device)
    v = torch.tensor([[1.0, 1, 1, 1], [1, 1, 1, GARBAGE]], device=device)
    nv = torch.tensor([[1.0, 1, 1, GARBAGE], [1, 9, 2, GARBAGE]], device=device)
    term = torch.tensor([[0, 0, 0, 1], [0, 0, 0, 0]], device=device)
    trunc = torch.tensor([[0.0, 0, 0, 0], [0, 1, 0, 1]], device=device)  # 0/1 floats accepted
    lengths = torch.tensor([4, 3], device=device)
    adv, ret = gae(r, v, nv, term, trunc, lengths, 0.5, 1.0)
    close(adv, torch.tensor([[2.25, 3.5, 4.0, 3.0], [3.25, 5.5, 3.0, 0.0]]), tol=1e-6)
    close(ret, torch.tensor([[3.25, 4.5, 5.0, 4.0], [4.25, 6.5, 4.0, 0.0]]), tol=1e-6)
    # lam = 0: A0 of row 1 is just delta_0 = 0.5.
    adv0, _ = gae(r, v, nv, term, trunc, lengths, 0.5, 0.0)
    close(adv0, torch.tensor([[0.5, 1.5, 2.5, 3.0], [0.5, 5.5, 3.0, 0.0]]), tol=1e-6)


def test_nan_padding_is_ignored(device):
    r, v, nv, term, trunc, lengths = (x.to(device) for x in random_batch(11))
    pad = ~valid_mask(lengths, r.shape[1])

    def run_all():
        return [
            discounted_returns(r, term, trunc, lengths, 0.9, nv),
            *gae(r, v, nv, term, trunc, lengths, 0.9, 0.95),
            n_step_returns(r, nv, term, trunc, lengths, 0.9, 3),
            td_targets(r, nv, term, trunc, 0.9, lengths=lengths),
        ]

    ok = run_all()
    for x in (r, v, nv):
        x[pad] = float("nan")
    bad = run_all()
    for a, b in zip(ok, bad, strict=True):
        assert not torch.isnan(b).any()
        close(a, b)


# ----------------------------------------------------------------------------------------------
# Equality with the python reference loops on random data.


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("gamma", [0.0, 0.9, 1.0])
def test_discounted_returns_reference(seed, gamma, device):
    r, _, nv, term, trunc, lengths = (x.to(device) for x in random_batch(seed))
    lens = lengths.tolist()
    rl, nvl, tl, trl = lists(r, nv, term, trunc)
    out = discounted_returns(r, term, trunc, lengths, gamma, next_value=nv)
    close(out, (ref_discounted(rl, tl, trl, lens, gamma, nvl)))
    out = discounted_returns(r, term, trunc, lengths, gamma)
    close(out, (ref_discounted(rl, tl, trl, lens, gamma)))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("n", [1, 2, 3, 9])  # T = 7, so 9 = T + 2
@pytest.mark.parametrize("gamma", [0.0, 0.5, 0.99, 1.0])
def test_n_step_reference(seed, n, gamma, device):
    r, _, nv, term, trunc, lengths = (x.to(device) for x in random_batch(seed))
    rl, nvl, tl, trl = lists(r, nv, term, trunc)
    out = n_step_returns(r, nv, term, trunc, lengths, gamma, n)
    close(out, (ref_nstep(rl, nvl, tl, trl, lengths.tolist(), gamma, n)))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("gamma", "lam"), [(0.99, 0.95), (0.9, 0.0), (0.9, 1.0), (1.0, 0.5)])
def test_gae_reference(seed, gamma, lam, device):
    r, v, nv, term, trunc, lengths = (x.to(device) for x in random_batch(seed))
    adv, ret = gae(r, v, nv, term, trunc, lengths, gamma, lam)
    ref_a, ref_r = ref_gae(*lists(r, v, nv, term, trunc), lengths.tolist(), gamma, lam)
    close(adv, ref_a)
    close(ret, ref_r)


# ----------------------------------------------------------------------------------------------
# Identities between the estimators.


@pytest.mark.parametrize("seed", SEEDS)
def test_n_step_1_is_td(seed, device):
    r, _, nv, term, trunc, lengths = (x.to(device) for x in random_batch(seed))
    out = n_step_returns(r, nv, term, trunc, lengths, 0.9, 1)
    td = td_targets(r, nv, term, trunc, 0.9, lengths=lengths)
    close(out, td)
    valid = valid_mask(lengths, r.shape[1])
    close(out[valid], td_targets(r, nv, term, trunc, 0.9)[valid])


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("n", [7, 8, 100])
def test_n_step_large_is_discounted_returns(seed, n, device):
    r, _, nv, term, trunc, lengths = (x.to(device) for x in random_batch(seed))
    out = n_step_returns(r, nv, term, trunc, lengths, 0.95, n)
    close(out, discounted_returns(r, term, trunc, lengths, 0.95, next_value=nv))


@pytest.mark.parametrize("seed", SEEDS)
def test_gae_lambda_limits(seed, device):
    r, v, nv, term, trunc, lengths = (x.to(device) for x in random_batch(seed, consistent=True))
    valid = valid_mask(lengths, r.shape[1])
    adv0, ret0 = gae(r, v, nv, term, trunc, lengths, 0.9, 0.0)
    td = td_targets(r, nv, term, trunc, 0.9, lengths=lengths)
    close(adv0[valid], (td - v)[valid])
    close(ret0, td)
    adv1, ret1 = gae(r, v, nv, term, trunc, lengths, 0.9, 1.0)
    mc = discounted_returns(r, term, trunc, lengths, 0.9, next_value=nv)
    close(adv1[valid], (mc - v)[valid])
    close(ret1, mc)
    assert (adv1[~valid] == 0).all() and (ret1[~valid] == 0).all()


# ----------------------------------------------------------------------------------------------
# dtypes, flag types, autograd, empty shapes.


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dtype_preserved(dtype, device):
    r, v, nv, term, trunc, lengths = random_batch(3)
    r, v, nv = (x.to(device, dtype) for x in (r, v, nv))
    term, trunc, lengths = term.to(device), trunc.to(device), lengths.to(device)
    outs = [
        discounted_returns(r, term, trunc, lengths, 0.9, nv),
        discounted_returns(r, term, trunc, lengths, 0.9),
        td_targets(r, nv, term, trunc, 0.9, lengths=lengths),
        n_step_returns(r, nv, term, trunc, lengths, 0.9, 3),
        *gae(r, v, nv, term, trunc, lengths, 0.9, 0.9),
        masked_mean(r, valid_mask(lengths, r.shape[1])),
    ]
    for out in outs:
        assert out.dtype == dtype
        assert out.device.type == device.type


def test_flags_as_numbers_match_bool():
    r, v, nv, term, trunc, lengths = random_batch(5)
    ref = gae(r, v, nv, term, trunc, lengths, 0.9, 0.8)
    for conv in (lambda x: x.float(), lambda x: x.long(), lambda x: x.to(torch.uint8)):
        out = gae(r, v, nv, conv(term), conv(trunc), lengths, 0.9, 0.8)
        close(out[0], ref[0])
        close(out[1], ref[1])
    close(
        n_step_returns(r, nv, term.double(), trunc.int(), lengths, 0.9, 2),
        n_step_returns(r, nv, term, trunc, lengths, 0.9, 2),
    )


def test_gradients_flow():
    r, v, nv, term, trunc, lengths = random_batch(2)
    v = torch.where(valid_mask(lengths, 7), v, 0).requires_grad_()
    nv = torch.where(valid_mask(lengths, 7), nv, 0).requires_grad_()
    adv, _ = gae(r, v, nv, term, trunc, lengths, 0.9, 0.9)
    (adv.sum() + discounted_returns(r, term, trunc, lengths, 0.9, nv).sum()).backward()
    assert v.grad is not None and nv.grad is not None
    assert nv.grad.abs().sum() > 0
    assert (v.grad[~valid_mask(lengths, 7)] == 0).all()


def test_empty_time_and_batch():
    for nb, nt in [(3, 0), (0, 4)]:
        r = torch.zeros(nb, nt)
        f = torch.zeros(nb, nt, dtype=torch.bool)
        lens = torch.zeros(nb, dtype=torch.long)
        assert discounted_returns(r, f, f, lens, 0.9, r).shape == (nb, nt)
        assert n_step_returns(r, r, f, f, lens, 0.9, 3).shape == (nb, nt)
        assert gae(r, r, r, f, f, lens, 0.9, 0.9)[0].shape == (nb, nt)


# ----------------------------------------------------------------------------------------------
# Validation errors.


def _args():
    r = torch.zeros(3, 5)
    f = torch.zeros(3, 5, dtype=torch.bool)
    return r, f, torch.tensor([5, 2, 0])


def test_errors_shapes():
    r, f, lens = _args()
    bad = torch.zeros(3, 4)
    with pytest.raises(ShapeError, match=r"next_value has shape \(3, 4\), expected \(3, 5\) like"):
        td_targets(r, bad, f, f, 0.9)
    with pytest.raises(ShapeError, match=r"next_value has shape \(3, 4\), expected \(3, 5\)"):
        discounted_returns(r, f, f, lens, 0.9, next_value=bad)
    with pytest.raises(ShapeError, match=r"next_value has shape \(3, 4\)"):
        n_step_returns(r, bad, f, f, lens, 0.9, 2)
    with pytest.raises(ShapeError, match=r"value has shape \(3, 4\), expected \(3, 5\) like rew"):
        gae(r, bad, r, f, f, lens, 0.9, 0.9)
    with pytest.raises(ShapeError, match=r"^next_value has shape \(3, 4\)"):
        gae(r, r, bad, f, f, lens, 0.9, 0.9)
    with pytest.raises(ShapeError, match=r"terminated has shape \(3, 4\), expected \(3, 5\)"):
        gae(r, r, r, bad.bool(), f, lens, 0.9, 0.9)
    with pytest.raises(ShapeError, match=r"truncated has shape \(5,\), expected \(3, 5\)"):
        discounted_returns(r, f, f[0], lens, 0.9)
    with pytest.raises(ShapeError, match=r"truncated has shape \(3, 4\)"):
        td_targets(r, r, f, bad, 0.9)
    with pytest.raises(ShapeError, match=r"reward must be 2-D \(B, T\), got shape \(5,\)"):
        discounted_returns(r[0], f[0], f[0], lens, 0.9)
    assert issubclass(ShapeError, ValueError)


def test_errors_lengths():
    r, f, lens = _args()
    with pytest.raises(ShapeError, match=r"lengths has shape \(2,\), expected \(3,\)"):
        gae(r, r, r, f, f, lens[:2], 0.9, 0.9)
    with pytest.raises(ShapeError, match=r"lengths has shape \(3, 1\), expected \(3,\)"):
        n_step_returns(r, r, f, f, lens[:, None], 0.9, 1)
    with pytest.raises(ShapeError, match=r"lengths has shape \(2,\)"):
        td_targets(r, r, f, f, 0.9, lengths=lens[:2])
    with pytest.raises(ShapeError, match=r"lengths must lie in \[0, 5\].*max 6"):
        discounted_returns(r, f, f, torch.tensor([6, 0, 0]), 0.9)
    with pytest.raises(ShapeError, match=r"lengths must lie in \[0, 5\].*min -1"):
        gae(r, r, r, f, f, torch.tensor([-1, 0, 0]), 0.9, 0.9)
    with pytest.raises(TypeError, match="lengths must be an integer tensor"):
        discounted_returns(r, f, f, lens.float(), 0.9)
    with pytest.raises(ShapeError, match=r"lengths has shape \(\), expected \(B,\)"):
        valid_mask(torch.tensor(3), 4)
    with pytest.raises(ValueError, match="T must be >= 0, got -1"):
        valid_mask(lens, -1)


@pytest.mark.parametrize("gamma", [-0.1, 1.5, float("nan")])
def test_errors_gamma(gamma):
    r, f, lens = _args()
    with pytest.raises(ValueError, match=r"gamma must be in \[0, 1\], got"):
        discounted_returns(r, f, f, lens, gamma)
    with pytest.raises(ValueError, match=r"gamma must be in \[0, 1\]"):
        td_targets(r, r, f, f, gamma)
    with pytest.raises(ValueError, match=r"gamma must be in \[0, 1\]"):
        n_step_returns(r, r, f, f, lens, gamma, 2)
    with pytest.raises(ValueError, match=r"gamma must be in \[0, 1\]"):
        gae(r, r, r, f, f, lens, gamma, 0.9)


@pytest.mark.parametrize("lam", [-0.5, 1.01])
def test_errors_lam(lam):
    r, f, lens = _args()
    with pytest.raises(ValueError, match=rf"lam must be in \[0, 1\], got {lam}"):
        gae(r, r, r, f, f, lens, 0.9, lam)


@pytest.mark.parametrize("n", [0, -2, 1.5, True])
def test_errors_n(n):
    r, f, lens = _args()
    with pytest.raises(ValueError, match=r"n must be an integer >= 1, got"):
        n_step_returns(r, r, f, f, lens, 0.9, n)


def test_errors_masked_mean():
    x = torch.zeros(3, 5)
    with pytest.raises(ShapeError, match=r"mask has shape \(3, 4\), expected one broadcastable"):
        masked_mean(x, torch.ones(3, 4, dtype=torch.bool))
    with pytest.raises(ShapeError, match=r"mask has shape \(2, 3, 5\)"):  # would grow x
        masked_mean(x, torch.ones(2, 3, 5, dtype=torch.bool))


def test_conjugate_gradient_solves_a_known_spd_system():
    from rlstruct.blocks.functional import conjugate_gradient

    g = torch.Generator().manual_seed(0)
    m = torch.randn(12, 12, generator=g, dtype=torch.float64)
    a = m @ m.T + 0.5 * torch.eye(12, dtype=torch.float64)
    x_true = torch.randn(12, generator=g, dtype=torch.float64)
    calls = []
    x = conjugate_gradient(lambda v: calls.append(1) or a @ v, a @ x_true, n_iters=50, tol=1e-20)
    torch.testing.assert_close(x, x_true, rtol=1e-8, atol=1e-8)
    assert len(calls) <= 50
    # Fewer iterations: a partial solution, yet the residual decreased in A's norm.
    x3 = conjugate_gradient(lambda v: a @ v, a @ x_true, n_iters=3)
    err = x3 - x_true
    assert float(err @ a @ err) < float(x_true @ a @ x_true)
    with pytest.raises(ConfigError, match="n_iters >= 1"):
        conjugate_gradient(lambda v: v, x_true, n_iters=0)
    with pytest.raises(ShapeError, match="1-D"):
        conjugate_gradient(lambda v: v, a, n_iters=3)
