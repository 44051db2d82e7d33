"""Which learner group a run learns with, and how its checkpoints see it
(:meth:`rlstruct.runs.run.Run.learner_group`, whose docstring says what each layout gets)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from rlstruct.agent import Agent
from rlstruct.learners.base import GroupPart, LearnerGroupBase, OptimizerFactory
from rlstruct.learners.rank import algorithm_learn
from rlstruct.learners.torchrun import torchrun_group, torchrun_world

__all__ = ["learner_group"]


def learner_group(
    run: Any, make_model: Callable[[], torch.nn.Module], model: torch.nn.Module,
    make_optimizer: OptimizerFactory, learn: Callable[..., Any],
    make_agent: Callable[[torch.nn.Module], Agent] | None, per_rank: tuple[str, ...],
    stacked: bool, policy: str,
) -> LearnerGroupBase:
    """The group of :meth:`Run.learner_group <rlstruct.runs.run.Run.learner_group>` (the same
    arguments; ``run`` is the Run), entered into the run's exit stack and registered with its
    checkpoints."""
    layout = run.cfg.layout
    rank_learn = partial(algorithm_learn, learn=learn, make_agent=make_agent, cfg=run.cfg,
                         per_rank=per_rank, stacked=stacked, precision=run.cfg.precision)
    group: LearnerGroupBase
    if (torchrun_world() == 1 and layout.n_learners == 1 and layout.learner_devices is None
            and layout.learner_backend == "local"):
        from rlstruct.learners.local import LocalLearner

        checked = None if make_agent is None else (lambda m: run.learner(make_agent(m)))
        takes_clock = "out_of_time" in inspect.signature(learn).parameters
        local_learn = partial(algorithm_learn, learn=learn, make_agent=checked, cfg=run.cfg,
                              precision=run.cfg.precision,
                              stacked=stacked, out_of_time=run.out_of_time if takes_clock else None)
        group = run._stack.enter_context(LocalLearner(model, make_optimizer, local_learn,
                                                      run.device))
    elif torchrun_world() > 1:  # torchrun: this is rank 0, the others wait in serve_rank
        group = run._stack.enter_context(torchrun_group(
            run.algo, layout, make_model, make_optimizer, rank_learn, model, run.device))
    elif layout.learner_backend == "ray":  # ranks as Ray actors, placed by Ray
        from rlstruct.learners.ray_group import RayLearnerGroup

        group = run._stack.enter_context(RayLearnerGroup(
            make_model, make_optimizer, rank_learn, model.state_dict(),
            n_learners=layout.n_learners, num_gpus=layout.learner_num_gpus,
            num_cpus=layout.learner_num_cpus, resources=layout.learner_resources,
            address=layout.ray_address, n_threads=run.cfg.n_threads))
    else:
        from rlstruct.learners.group import LearnerGroup

        devices = (layout.learner_devices.split(",") if layout.learner_devices
                   else [str(torch.device(run.device.type, k)) for k in range(layout.n_learners)]
                   if run.device.type == "cuda" else [str(run.device)] * layout.n_learners)
        group = run._stack.enter_context(LearnerGroup(
            make_model, make_optimizer, rank_learn, model.state_dict(),
            n_learners=layout.n_learners, devices=devices, seed=run.cfg.seed,
            n_threads=run.cfg.n_threads))
        if run._training_batcher is not None:  # rank 0 writes into its ring where it can
            group.publish_to(run._training_batcher)
    run._groups.append(group)  # a stop collects its batch in flight before the checkpoint
    # Checkpoints hold the group's (rank 0's) model and optimizer; the group stands for
    # ``model`` (with a ``policy`` prefix: for the policy module, its part of the weights), so
    # the checkpoint records how to rebuild it and the evaluation agent (rlstruct evaluate).
    if not policy:
        run._stands_for["model"] = model
        run.checkpoint_state(model=group, optimizer=group.optimizer)
    else:
        run._stands_for["model"] = model.get_submodule(policy.rstrip("."))
        run.checkpoint_state(learner=group, model=GroupPart(group, policy),
                             optimizer=group.optimizer)
    return group
