"""``GymEnv`` (episodic) and ``GymEnvInf`` (auto-reset): ``N`` gymnasium envs as one VecEnv.

Both step their envs one after the other in the calling process (worker processes are the
batchers' business). This is the batchers' hot path, so a step costs, beyond the envs themselves:
one vectorised numpy check of all actions, one fresh numpy array per key (a one-array observation
is built in one call from the envs' answers; a Dict or Tuple one is written by index into staging
arrays allocated once, then copied), and one ``torch.from_numpy`` per key. Nothing returned ever
aliases a staging array, so the returned tensors outlive the next step. ``GymEnvInf``'s
``obs_next`` patches by index only the keys whose reset value varies by row (observation,
``reward``, ``last_action``, ``info/*``); the others follow from ``done``.

Observation keys and dtypes follow :mod:`rlstruct.envs.spaces`; every observation also holds
``reward`` (float32), ``terminated``, ``truncated``, ``done`` (bool), ``initial_state`` (bool, True
in a reset observation), ``last_action`` (the action's shape and dtype; the space's default at
reset), ``env_step`` (int64, 0 at reset), per name in ``info_keys``, ``info/<name>`` (float32,
0 where the env's ``info`` lacks it) and, for an env whose ``info`` gives ``action_mask``, the
bool ``action_mask`` (:mod:`rlstruct.envs.masks`). Keys, shapes and dtypes are the same at reset
and at step.

Seeding: env ``k`` of a VecEnv built with ``seed=s`` has its ``action_space`` seeded ``s + k`` and
gets ``reset(seed=s + k)`` on its FIRST reset only; later resets continue the env's own RNG, as
gymnasium recommends.

Rewards must be real scalars (a ``str``, ``None``, an array or a complex number raises
:class:`RewardError` naming the env and its ``env_step``; nothing is cast silently), stored as
float32 (a finite reward too large for it raises ``FloatingPointError`` with
``check_finite=True``, else it is ``inf`` with a warning naming the env). An invalid action raises
:class:`ActionError` before any env is stepped; any later error (from an env, an observation that
does not match its space, a bad reward) leaves the envs half-stepped, and the next ``step`` asks
for a ``reset``. A float observation holding NaN or an infinity raises :class:`ObservationError`
in the ``step`` or ``reset`` that produced it (``check_obs=True``, the default). Every error about
one env carries ``exc.env_index`` (its LOCAL index) and names it by its global index in the
message (docs/guide-reliability.md).
"""

from __future__ import annotations

import numpy as np
import torch

from rlstruct import keys as K
from rlstruct.dicttensor import DictTensor
from rlstruct.envs.base import StepResult
from rlstruct.envs.factories import EnvFactory
from rlstruct.envs.gym_base import GymVecEnv, numpy_dicttensor

__all__ = ["GymEnv", "GymEnvInf", "EnvFactory"]

_CPU = torch.device("cpu")
_INFO = "info/"


class GymEnv(GymVecEnv):
    """Episodic VecEnv over ``N`` gymnasium envs: an env that ends its episode stops running.

    ``step`` takes one action row per running env and returns ``obs_t1`` for those rows and
    ``obs_next`` only for the envs still running; once every episode has ended, ``reset`` starts
    new ones.

    Args:
        env: a gymnasium id (``N`` envs made with ``gym.make(env, **make_kwargs)``) or a list of
            zero-argument factories, each returning one gymnasium env.
        n_envs: ``N`` for a gymnasium id (default 1); for factories, ``None`` or ``len(env)``.
        seed: env ``k`` is reset with ``seed + k`` on its first reset, and its action space is
            seeded ``seed + k``.
        make_kwargs: keyword arguments of ``gym.make`` (gymnasium id only).
        env_info_keys: the keys of ``env_info`` passed as reset options (default: all).
        info_keys: names of numeric entries of gymnasium's ``info`` recorded as float32
            ``info/<name>`` keys (0 where absent).
        env_id_offset: global index of env 0, used in error messages (batcher workers).
        check_finite: raise ``FloatingPointError`` (naming env, key and env_step) when a reward
            is NaN or Inf or a finite reward overflows float32 (without it, such a reward becomes
            inf with a ``RuntimeWarning`` naming the env); implies ``check_obs``.
        obs_dtype: ``None`` keeps the observations' dtype (MuJoCo's are float64); a float dtype
            (``"float32"``, ``torch.float32``...) casts a float ``Box`` observation to it, in each
            env (gymnasium's ``DtypeObservation`` wrapper: the space says the new dtype).
        check_obs: raise :class:`~rlstruct.errors.ObservationError` (naming env, key and
            env_step) when a float observation leaf holds NaN or an infinity, at a step or in a
            reset observation, before any agent sees it (one ``np.isfinite`` pass per float
            key and step). ``False`` lets such observations through.
        action_mask: record ``info["action_mask"]`` (a ``Discrete`` action space's legal
            actions) as the bool observation key ``action_mask`` ``(A,)``: ``None`` when env 0's
            first reset ``info`` holds it, ``True`` always, ``False`` never
            (:mod:`rlstruct.envs.masks`).

    Raises:
        ConfigError: bad ``env``, ``n_envs``, ``seed``, ``make_kwargs``, offset or ``obs_dtype``
            (not a float dtype, or observations that are not a float ``Box``), or
            ``action_mask=True`` for an action space that is not ``Discrete``.
        SpaceError: unsupported observation or action space, or envs with different spaces.

    Examples:
        >>> from rlstruct.envs.debug import CounterEnv
        >>> env = GymEnv([lambda: CounterEnv(episode_length=1), lambda: CounterEnv()])
        >>> obs, running = env.reset()
        >>> obs["frame"].shape, running.tolist()
        (torch.Size([2, 3]), [0, 1])
        >>> action = DictTensor({"action": torch.zeros(2, dtype=torch.long)})
        >>> (obs_t1, was), (obs_next, running) = env.step(action)
        >>> obs_t1["done"].tolist(), running.tolist(), obs_next["env_step"].tolist()
        ([True, False], [1], [1])
    """

    def step(self, action: DictTensor) -> StepResult:
        """Steps the running envs.

        Args:
            action: DictTensor with ``action`` of shape ``(n_running, *action_shape)``, rows in the
                order of ``running``.

        Returns:
            ``((obs_t1, was_running), (obs_next, still_running))``: ``obs_t1`` ``(n_running, ...)``
            answers the action (TRUE final observation at an episode end); ``obs_next`` holds the
            rows of ``obs_t1`` whose env goes on (it shares ``obs_t1``'s tensors when none ended).
            Running indices are int64 CPU tensors.

        Raises:
            BatcherStateError: no reset yet, closed, failed step, or no env running.
            ShapeError: ``action`` does not have one row per running env, or an observation
                has another shape than its space.
            ActionError: an action is outside the action space (no env was stepped).
            SpaceError: an observation has another dtype than its space (no silent cast).
            RewardError: a reward is not a real scalar number.
            ObservationError: a float observation holds NaN or an infinity (``check_obs``).
            ActionMaskError: an action mask allows no action in an observation an agent acts
                on, or an env's ``info`` no longer gives it (:mod:`rlstruct.envs.masks`).
        """
        run, a = self._begin_step(action)
        arrays = self._step_obs(run, a, self._step_envs(run, a))
        n = run.shape[0]
        obs_t1 = numpy_dicttensor(arrays, n)
        keep = ~arrays[K.DONE]
        if keep.all():
            still = run
            obs_next = DictTensor.trusted(dict(obs_t1.tensors), n, _CPU)
        else:
            still = run[keep]
            obs_next = obs_t1.index(torch.from_numpy(keep))
        self._running = still
        return (obs_t1, torch.from_numpy(run.copy())), (obs_next, torch.from_numpy(still.copy()))


class GymEnvInf(GymVecEnv):
    """Auto-reset VecEnv over ``N`` gymnasium envs: all ``N`` rows run forever.

    When env ``k`` ends an episode, ``obs_t1`` row ``k`` keeps its TRUE final observation (with
    ``terminated``/``truncated``) and ``obs_next`` row ``k`` holds the observation of the new
    episode (``initial_state`` True, ``env_step`` 0). The env is reset by this class (with the
    options of the last ``reset(env_info)``); gymnasium's autoreset wrappers are not used.

    Same arguments as :class:`GymEnv`.

    Examples:
        >>> from rlstruct.envs.debug import CounterEnv
        >>> env = GymEnvInf([lambda: CounterEnv(episode_length=1)])
        >>> obs, running = env.reset()
        >>> action = DictTensor({"action": torch.zeros(1, dtype=torch.long)})
        >>> (obs_t1, _), (obs_next, running) = env.step(action)
        >>> obs_t1["frame"].tolist(), obs_next["frame"].tolist(), running.tolist()
        ([[0, 0, 1]], [[0, 1, 0]], [0])
    """

    def step(self, action: DictTensor) -> StepResult:
        """Steps all ``N`` envs and resets those whose episode ended.

        Args:
            action: DictTensor with ``action`` of shape ``(N, *action_shape)``.

        Returns:
            ``((obs_t1, arange(N)), (obs_next, arange(N)))``; ``obs_next`` shares ``obs_t1``'s
            tensors when no env was reset.

        Raises:
            BatcherStateError: no reset yet, closed, or a failed step.
            ShapeError: ``action`` does not have ``N`` rows, or an observation has another
                shape than its space.
            ActionError: an action is outside the action space (no env was stepped).
            SpaceError: an observation has another dtype than its space (no silent cast).
            RewardError: a reward is not a real scalar number.
            ObservationError: a float observation holds NaN or an infinity (``check_obs``).
            ActionMaskError: an action mask allows no action in an observation an agent acts
                on, or an env's ``info`` no longer gives it (:mod:`rlstruct.envs.masks`).
        """
        run, a = self._begin_step(action)
        t1 = self._step_obs(run, a, self._step_envs(run, a))
        n = self._n
        done = t1[K.DONE]
        t1_dt = numpy_dicttensor(t1, n)
        if np.count_nonzero(done):  # (``any()`` costs 4x more on a few dozen rows)
            ended = done.nonzero()[0]
            for k in ended.tolist():
                self._reset_env(k)
            self._check_reset_obs()
            nxt = self._next_obs(t1, ended)
            nxt_dt = numpy_dicttensor(nxt, n)
        else:
            nxt_dt = DictTensor.trusted(dict(t1_dt.tensors), n, _CPU)
        # Fresh index tensors: a caller may modify them in place.
        return (t1_dt, torch.from_numpy(run.copy())), (nxt_dt, torch.from_numpy(run.copy()))

    def _next_obs(self, t1: dict[str, np.ndarray], ended: np.ndarray) -> dict[str, np.ndarray]:
        """``obs_next``'s arrays: ``t1``'s with the reset observation in the rows ``ended`` (where
        ``done`` is set; row k is env k). Only the observation, ``last_action`` and ``info/*``
        are patched by index; the rest follows from ``done``: no row that goes on is done, so
        the end flags are all False, ``initial_state`` is ``done``, ``reward`` is 0 where
        ``done``, and ``env_step`` is the envs' counters (the resets set them to 0)."""
        reset = self._reset_buf
        done = t1[K.DONE]
        nxt = {}
        for lf in self._leaves:
            x = t1[lf.key].copy()
            # The rows of ``ended``, as a mask that broadcasts over the leaf's feature dims.
            np.copyto(x, reset[lf.key], where=done.reshape(-1, *(1,) * len(lf.shape)))
            nxt[lf.key] = x
        reward = t1[K.REWARD].copy()
        reward[ended] = 0
        nxt[K.REWARD] = reward
        for key in (K.TERMINATED, K.TRUNCATED, K.DONE):
            nxt[key] = np.zeros(self._n, bool)
        nxt[K.INITIAL_STATE] = done.copy()
        last = t1[K.LAST_ACTION].copy()
        last[ended] = self._act.default
        nxt[K.LAST_ACTION] = last
        nxt[K.ENV_STEP] = self._t.copy()
        for key in [_INFO + name for name in self._info_keys] + (
                [K.ACTION_MASK] if self._mask_info else []):
            x = t1[key].copy()
            x[ended] = reset[key][ended]
            nxt[key] = x
        return nxt
