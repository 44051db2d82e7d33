"""Which learner group a run learns with, and how its checkpoints see it: :func:`learner_group`
(what :meth:`rlstruct.runs.run.Run.learner_group` returns).

One learner (the default): a :class:`~rlstruct.learners.local.LocalLearner` on ``model``
itself, on the learner device, in this process (``run.out_of_time`` reaches a ``learn`` that
takes ``out_of_time``). ``--n-learners N`` (or ``--learner-devices``): a
:class:`~rlstruct.learners.group.LearnerGroup` of N processes; ``--learner-backend ray``: a
:class:`~rlstruct.learners.ray_group.RayLearnerGroup`; under torchrun, rank 0's
:func:`~rlstruct.learners.torchrun.torchrun_group`. Closed with the run. Checkpoints hold the
group's (rank 0's) model as ``model`` and its optimizer as ``optimizer``.

It uses the run's public surface only: ``cfg``, ``algo``, ``device``, ``world_size``,
``batcher``, :meth:`~rlstruct.runs.run.Run.learner`, :meth:`~rlstruct.runs.run.Run.out_of_time`,
:meth:`~rlstruct.runs.run.Run.enter` and :meth:`~rlstruct.runs.run.Run.register_group`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from rlstruct.agent import Agent
from rlstruct.learners.base import GroupPart, LearnerGroupBase, OptimizerFactory
from rlstruct.learners.rank import algorithm_learn
from rlstruct.learners.torchrun import torchrun_group

__all__ = ["learner_group", "local_learner"]


def local_learner(run: Any) -> bool:
    """Whether :func:`learner_group` gives ``run`` a
    :class:`~rlstruct.learners.local.LocalLearner`: one rank, in this process, in the caller's
    thread (no ``--n-learners``, ``--learner-devices``, ``--learner-backend ray`` or torchrun)."""
    layout = run.cfg.layout
    return (run.world_size == 1 and layout.n_learners == 1 and layout.learner_devices is None
            and layout.learner_backend == "local")


def learner_group(
    run: Any, make_model: Callable[[], torch.nn.Module], model: torch.nn.Module,
    make_optimizer: OptimizerFactory, learn: Callable[..., Any],
    make_agent: Callable[[torch.nn.Module], Agent] | None, per_rank: tuple[str, ...],
    stacked: bool, policy: str,
) -> LearnerGroupBase:
    """The group of :meth:`Run.learner_group <rlstruct.runs.run.Run.learner_group>` (see the
    module notes), entered into the run's exit stack and registered with its checkpoints.

    Args:
        run: the :class:`~rlstruct.runs.run.Run`.
        make_model: builds a rank's replica (picklable for the process and Ray ranks).
        model: the algorithm's model (its weights start every rank).
        make_optimizer: ``make_optimizer(params, device=...)``.
        learn: the algorithm's learn function.
        make_agent: ``make_agent(model)``, the agent ``learn`` gets (None: the model);
            wrapped in CheckDevice with ``--check-devices``.
        per_rank: integer config fields divided among the ranks (``minibatch_size``).
        stacked: batches of ``k`` stacked minibatches, one ``learn`` each.
        policy: the prefix of the policy's weights in ``model`` (SAC: ``"actor."``, the
            module the workers and the evaluation run): checkpoints then hold them as
            ``model`` and the whole learner model as ``learner``.
    """
    layout = run.cfg.layout
    rank_learn = partial(algorithm_learn, learn=learn, make_agent=make_agent, cfg=run.cfg,
                         per_rank=per_rank, stacked=stacked, precision=run.cfg.precision)
    group: LearnerGroupBase
    if local_learner(run):
        from rlstruct.learners.local import LocalLearner

        checked = None if make_agent is None else (lambda m: run.learner(make_agent(m)))
        takes_clock = "out_of_time" in inspect.signature(learn).parameters
        local_learn = partial(algorithm_learn, learn=learn, make_agent=checked, cfg=run.cfg,
                              precision=run.cfg.precision,
                              stacked=stacked, out_of_time=run.out_of_time if takes_clock else None)
        group = run.enter(LocalLearner(model, make_optimizer, local_learn,
                                                      run.device))
    elif run.world_size > 1:  # torchrun: this is rank 0, the others wait in serve_rank
        group = run.enter(torchrun_group(
            run.algo, layout, make_model, make_optimizer, rank_learn, model, run.device))
    elif layout.learner_backend == "ray":  # ranks as Ray actors, placed by Ray
        from rlstruct.learners.ray_group import RayLearnerGroup

        group = run.enter(RayLearnerGroup(
            make_model, make_optimizer, rank_learn, model.state_dict(),
            n_learners=layout.n_learners, num_gpus=layout.learner_num_gpus,
            num_cpus=layout.learner_num_cpus, resources=layout.learner_resources,
            address=layout.ray_address, n_threads=run.cfg.n_threads))
    else:
        from rlstruct.learners.group import LearnerGroup

        devices = (layout.learner_devices.split(",") if layout.learner_devices
                   else [str(torch.device(run.device.type, k)) for k in range(layout.n_learners)]
                   if run.device.type == "cuda" else [str(run.device)] * layout.n_learners)
        group = run.enter(LearnerGroup(
            make_model, make_optimizer, rank_learn, model.state_dict(),
            n_learners=layout.n_learners, devices=devices, seed=run.cfg.seed,
            n_threads=run.cfg.n_threads))
        if run.batcher is not None:  # rank 0 writes into its ring where it can
            group.publish_to(run.batcher)
    # Checkpoints hold the group's (rank 0's) model and optimizer; the group stands for
    # ``model`` (with a ``policy`` prefix: for the policy module, its part of the weights), so
    # the checkpoint records how to rebuild it and the evaluation agent (rlstruct evaluate).
    if not policy:
        run.register_group(group, model, model=group, optimizer=group.optimizer)
    else:
        run.register_group(group, model.get_submodule(policy.rstrip(".")), learner=group,
                           model=GroupPart(group, policy), optimizer=group.optimizer)
    return group
