"""FlatAdam: one flat buffer behind a net's parameters, the same updates as torch's Adam."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rlstruct.errors import ConfigError, LearnerError
from rlstruct.learn.nets import MLPActorCritic
from rlstruct.learn.optim import FlatAdam, adam, flat_adam, gradient_step


def _loss(model: MLPActorCritic, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    logits, value = model(x)
    return nn.functional.cross_entropy(logits, a) + value.square().mean()


def _train(flat: bool, max_grad_norm: float, steps: int = 25) -> MLPActorCritic:
    torch.manual_seed(0)
    model = MLPActorCritic(4, 3, 16)
    opt = (flat_adam if flat else adam)(model.parameters(), 1e-2, "cpu", eps=1e-5)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x, a = torch.randn(32, 4, generator=gen), torch.randint(0, 3, (32,), generator=gen)
        gradient_step(opt, _loss(model, x, a), max_grad_norm)
    return model


@pytest.mark.parametrize("max_grad_norm", [0.0, 0.5, 100.0])
def test_flat_adam_trains_as_torchs_adam_does(max_grad_norm: float) -> None:
    plain, flat = _train(False, max_grad_norm), _train(True, max_grad_norm)
    for (name, a), b in zip(plain.state_dict().items(), flat.state_dict().values()):
        # the norm of one tensor rounds differently from the norm of the per-tensor norms
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)
    torch.manual_seed(0)
    initial = MLPActorCritic(4, 3, 16)
    assert not torch.allclose(flat.actor[0].weight, initial.actor[0].weight, atol=1e-3)


def test_the_parameters_are_views_of_the_flat_buffer() -> None:
    model = MLPActorCritic(4, 2, 8)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    opt = flat_adam(model.parameters(), 1e-3, "cpu")
    assert opt.flat.numel() == sum(p.numel() for p in model.parameters())
    for k, v in model.state_dict().items():  # values kept
        assert torch.equal(v, before[k]), k
    with torch.no_grad():
        opt.flat.zero_()
    assert all(not p.detach().any() for p in model.parameters())
    model.load_state_dict(before)  # an in-place copy: into the buffer
    n = model.actor[0].weight.numel()
    assert torch.equal(opt.flat[:n], before["actor.0.weight"].flatten())


def test_any_way_of_zeroing_the_gradients_still_trains() -> None:
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = flat_adam(model.parameters(), 0.1, "cpu")
    x = torch.ones(4, 3)
    for zero in (lambda: model.zero_grad(), lambda: opt.zero_grad(),
                 lambda: setattr(model.weight, "grad", None)):
        zero()
        before = model.weight.detach().clone()
        model(x).sum().backward()
        assert float(opt.flat_grad().abs().sum()) > 0
        opt.step()
        assert not torch.equal(model.weight, before)  # the update reached the module
        assert model.weight.grad is not None and model.weight.grad.data_ptr() == \
            opt.flat_grad().data_ptr()


def test_gradients_accumulate_over_backward_calls() -> None:
    model = nn.Linear(2, 1, bias=False)
    opt = flat_adam(model.parameters(), 0.1, "cpu")
    opt.zero_grad()
    model(torch.ones(1, 2)).sum().backward()
    model(torch.ones(1, 2)).sum().backward()
    assert opt.flat_grad().tolist() == [2.0, 2.0]


def test_new_storage_for_a_parameter_is_refused_by_name() -> None:
    model = nn.Linear(2, 3)
    opt = flat_adam(model.parameters(), 0.1, "cpu")
    model.bias.data = torch.zeros(3)
    model(torch.ones(1, 2)).sum().backward()
    with pytest.raises(LearnerError, match=r"parameter 1 \(shape \(3,\)\).*new storage"):
        opt.step()


def test_what_cannot_share_a_buffer_is_refused_with_every_reason() -> None:
    w = nn.Parameter(torch.ones(2))
    with pytest.raises(ConfigError, match="no parameter"):
        FlatAdam([], lr=0.1)
    with pytest.raises(ConfigError, match="given twice") as err:
        FlatAdam([w, w, torch.ones(2)], lr=0.1)
    assert "parameter 2" in str(err.value)  # both problems at once
    with pytest.raises(ConfigError, match="several devices or dtypes"):
        FlatAdam([w, nn.Parameter(torch.ones(2, dtype=torch.float64))], lr=0.1)
    with pytest.raises(ConfigError, match="groups"):
        FlatAdam([{"params": [w]}], lr=0.1)  # type: ignore[list-item]


def test_the_optimizer_state_round_trips_through_a_state_dict() -> None:
    a, b = _pair()
    opt_a = flat_adam(a.parameters(), 1e-2, "cpu")
    gradient_step(opt_a, a(torch.ones(2, 3)).sum(), 1.0)
    opt_b = flat_adam(b.parameters(), 1e-2, "cpu")
    b.load_state_dict(a.state_dict())
    opt_b.load_state_dict(opt_a.state_dict())
    for opt, net in ((opt_a, a), (opt_b, b)):
        gradient_step(opt, net(torch.ones(2, 3)).sum(), 1.0)
    assert torch.equal(opt_a.flat, opt_b.flat)


def test_the_update_is_torchs_adam_operation_for_operation() -> None:
    a, b = _pair()
    b.load_state_dict(a.state_dict())
    ours = FlatAdam(a.parameters(), lr=0.05, eps=1e-5)
    torchs = torch.optim.Adam(b.parameters(), lr=0.05, eps=1e-5, foreach=False)
    for i in range(6):
        x = torch.full((2, 3), float(i))
        for opt, net in ((ours, a), (torchs, b)):
            opt.zero_grad()
            net(x).square().sum().backward()
            opt.step()
        ours.param_groups[0]["lr"] *= 0.5  # annealed as the algorithms do
        torchs.param_groups[0]["lr"] *= 0.5
    assert torch.equal(a.weight, b.weight) and torch.equal(a.bias, b.bias)


def test_a_state_of_another_size_is_refused_and_torchs_adam_state_loads() -> None:
    a, b = _pair()
    opt = flat_adam(a.parameters(), 0.1, "cpu")
    other = flat_adam(nn.Linear(2, 2).parameters(), 0.1, "cpu")
    with pytest.raises(ValueError, match=r"for \[\(6,\)\] does not fit .* \(8 values\)"):
        opt.load_state_dict(other.state_dict())
    with pytest.raises(ValueError, match="not an Adam state"):
        opt.load_state_dict({"step": 3})
    with pytest.raises(ConfigError, match=r"on \['meta'\], not on cpu"):
        flat_adam(nn.Linear(2, 2, device="meta").parameters(), 0.1, "cpu")
    # a checkpoint of torch's Adam over the same parameters (written before FlatAdam) resumes
    b.load_state_dict(a.state_dict())
    torchs = torch.optim.Adam(b.parameters(), lr=0.05, eps=1e-5, foreach=False)
    for net, o in ((a, opt), (b, torchs)):
        o.zero_grad()
        net(torch.ones(2, 3)).square().sum().backward()
    torchs.step()
    ours = FlatAdam(a.parameters(), lr=0.0)
    ours.load_state_dict(torchs.state_dict())
    a.load_state_dict(b.state_dict())
    for net, o in ((a, ours), (b, torchs)):
        o.zero_grad()
        net(torch.ones(2, 3)).square().sum().backward()
        o.step()
    assert ours.param_groups[0]["lr"] == 0.05 and ours.state_dict()["state"][0]["step"] == 2
    assert torch.equal(a.weight, b.weight) and torch.equal(a.bias, b.bias)


def _pair() -> tuple[nn.Linear, nn.Linear]:
    torch.manual_seed(3)
    return nn.Linear(3, 2), nn.Linear(3, 2)
