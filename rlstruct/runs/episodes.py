"""Episode bookkeeping: the returns and lengths of the episodes that end in a stream of segments.

:class:`EpisodeTracker` works for every batcher mode, because it matches rows to environments by
``info["env_id"]`` instead of by row position:

- auto-reset segments (``GymEnvInf``): every env is in every segment and an episode may span
  many segments; the return so far of each unfinished episode is carried per env;
- episodic segments (``GymEnv``): a row leaves the batch once its episode has ended, so the
  rows of a later segment are a subset of the envs, in any order; ``reset()`` starts every env
  afresh (``observation/initial_state`` at the row's first step clears what was carried).

Example:
    >>> import torch
    >>> from rlstruct import DictTensor, TemporalDictTensor, Trajectories
    >>> def segment(env_id, reward, done, env_step):
    ...     steps = TemporalDictTensor({"_observation/reward": torch.tensor(reward),
    ...                                 "_observation/done": torch.tensor(done),
    ...                                 "_observation/env_step": torch.tensor(env_step)},
    ...                                torch.tensor([2] * len(env_id)))
    ...     return Trajectories(DictTensor({"env_id": torch.tensor(env_id)}), steps)
    >>> tracker = EpisodeTracker()
    >>> returns, lengths = tracker(segment([0, 1], [[1.0, 1.0], [2.0, 2.0]],
    ...                                    [[False, True], [False, False]], [[1, 2], [1, 2]]))
    >>> returns.tolist(), lengths.tolist()  # env 0 ended its episode; env 1 runs on
    ([2.0], [2])
    >>> returns, lengths = tracker(segment([1], [[3.0, 3.0]], [[True, False]], [[3, 1]]))
    >>> returns.tolist(), lengths.tolist()  # env 1, alone in row 0 now: 2 + 2 + 3
    ([7.0], [3])
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlstruct import keys as K
from rlstruct.trajectories import Trajectories

__all__ = ["EpisodeTracker"]

_REWARD = K.NEXT_OBSERVATION + K.REWARD
_DONE = K.NEXT_OBSERVATION + K.DONE
_ENV_STEP = K.NEXT_OBSERVATION + K.ENV_STEP
_INITIAL = K.OBSERVATION + K.INITIAL_STATE


class EpisodeTracker:
    """Returns and lengths of the episodes that end in consecutive segments, keyed by env id.

    Call it on every segment a batcher returns, in order. Work is vectorised over rows and time
    and done on the CPU (three small tensors of the segment are copied there).

    Attributes:
        carry: float64 ``(n_envs,)``, the return so far of each env's unfinished episode
            (indexed by ``env_id``; grows to the largest env id seen).
    """

    def __init__(self) -> None:
        self.carry = torch.zeros(0, dtype=torch.float64)

    def __call__(self, traj: Trajectories) -> tuple[Tensor, Tensor]:
        """The episodes that ended in ``traj``.

        Args:
            traj: a segment: ``info["env_id"]`` ``(B,)`` and the steps ``_observation/reward``,
                ``_observation/done`` and ``_observation/env_step`` ``(B, T)``;
                ``observation/initial_state``, when present, restarts a row's episode at t=0.

        Returns:
            ``(returns, lengths)``: float64 and int64 ``(N,)`` on the CPU, one entry per episode
            that ended, in the order they ended (by time step, then by row). A length is the
            ``env_step`` of the episode's final step.
        """
        steps = traj.trajectories
        env_id = traj.info[K.ENV_ID].cpu()
        valid = steps.mask().cpu()
        reward = torch.where(valid, steps[_REWARD].cpu().double(), 0.0)
        done = steps[_DONE].cpu() & valid
        if len(env_id) and int(env_id.max()) >= len(self.carry):
            grown = torch.zeros(int(env_id.max()) + 1, dtype=torch.float64)
            grown[: len(self.carry)] = self.carry
            self.carry = grown
        if done.shape[1] == 0:
            return reward.new_zeros(0), torch.zeros(0, dtype=torch.long)
        carry = self.carry[env_id]
        if _INITIAL in steps:  # a row whose first step starts an episode carries nothing
            carry = torch.where(steps[_INITIAL][:, 0].cpu(), 0.0, carry)
        total = carry.unsqueeze(1) + reward.cumsum(1)
        t = torch.arange(done.shape[1]).expand_as(done)
        ended = torch.where(done, t, -1).cummax(1).values  # the last episode end at or before t
        ended = torch.cat([torch.full_like(ended[:, :1], -1), ended[:, :-1]], 1)  # ... before t
        start = torch.where(ended >= 0, total.gather(1, ended.clamp(min=0)), 0.0)
        episode = total - start  # the return of the episode running at t, up to t
        # Padding adds no reward, so the last column holds what a running episode has so far.
        self.carry[env_id] = torch.where(done[:, -1], 0.0, episode[:, -1])
        length = steps[_ENV_STEP].cpu()
        return episode.T[done.T], length.T[done.T]

    def reset(self) -> None:
        """Forgets every unfinished episode."""
        self.carry.zero_()
