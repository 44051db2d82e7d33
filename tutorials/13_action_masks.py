"""Tutorial 13 — Action masks: an env that says which actions are legal.

Many envs allow only some actions at each step (board games, card games, a menu whose entries
come and go). Gymnasium and PettingZoo envs say which in ``info["action_mask"]`` (one 0/1 entry
per action of a ``Discrete`` space); sb3-contrib's envs put it in the observation,
``Dict({"observation": Box, "action_mask": MultiBinary(n)})``. rlstruct honours both:

1. The env layer: a ``GymEnv`` / ``GymEnvInf`` whose env gives ``info["action_mask"]`` at its
   first reset records it as the observation key ``action_mask`` (bool, ``(A,)`` per env), at
   every reset and step; a Dict observation's ``action_mask`` leaf is a key already. A mask that
   allows nothing, in an observation an agent must act on, raises ``ActionMaskError`` naming the
   env.
2. The agents: every algorithm with a categorical head (REINFORCE, A2C, PPO, IMPALA, APPO) sets
   the logits of illegal actions to a large negative number before it samples, takes the argmax
   or a log-probability, and so does the learner's replay with the stored
   ``observation/action_mask``: the stored and replayed log-probabilities agree. DQN explores
   and exploits among the legal actions, and its target maximises over the legal next ones.
3. ``rlstruct.load_policy(run_dir).act(obs, action_mask=info["action_mask"])``.

The task here, ``rlstruct/MaskedChoice-v0``, makes masks indispensable: 2 of 16 actions are
legal at each step, drawn at random, and the observation says nothing of which; an illegal
action ends the episode with reward -10, a legal one earns 1, and an episode lasts 20 steps.
PPO with the mask earns 20 per episode; PPO without it (``rlstruct/MaskedChoiceHidden-v0``, the
same env keeping its mask to itself) survives a step one time in eight, whatever it learns.

The runnable companion of one page, which explains it and links here:
[Algorithms: action masks](../docs/algorithms.md#action-masks).

Run: python tutorials/13_action_masks.py   (about 15 seconds on a CPU)
"""

import tempfile

import numpy as np

import rlstruct
from rlstruct import DictTensor
from rlstruct.algos import ppo
from rlstruct.envs import GymEnvInf
from rlstruct.envs.debug import MASKED_CHOICE_HIDDEN_ID, MASKED_CHOICE_ID
from rlstruct.runs.layout import LayoutConfig

if __name__ == "__main__":  # worker processes import this file: train in the main one only
    # 1. The env layer: info["action_mask"] is an observation key, at reset and at every step.
    env = GymEnvInf(MASKED_CHOICE_ID, n_envs=2)
    obs, _ = env.reset()
    print("observation keys:", sorted(obs.keys()))
    print("action_mask:", obs["action_mask"].shape, obs["action_mask"].dtype)
    legal = obs["action_mask"].float().argmax(-1)  # the first legal action of each env
    (answer, _), _ = env.step(DictTensor({"action": legal}))
    print("rewards of legal actions:", answer["reward"].tolist())
    env.close()

    # 2. PPO with and without the mask, on the same budget.
    runs = tempfile.mkdtemp()
    returns = {}
    for env_id in (MASKED_CHOICE_ID, MASKED_CHOICE_HIDDEN_ID):
        cfg = ppo.Config(env_id=env_id, max_frames=4096, eval_every=0, target_return=None,
                         runs_dir=runs, layout=LayoutConfig(n_processes=1, n_envs=8))
        summary = ppo.main(cfg)
        returns[env_id] = summary["run_dir"], summary["train_return_mean20"]
    for env_id, (_, mean) in returns.items():
        print(f"{env_id}: mean return of the last 20 episodes {mean:.1f} (the best is 20)")
    assert returns[MASKED_CHOICE_ID][1] == 20.0 and returns[MASKED_CHOICE_HIDDEN_ID][1] < 0

    # 3. The trained policy, given the legal actions as the env gives them.
    policy = rlstruct.load_policy(returns[MASKED_CHOICE_ID][0])
    mask = np.zeros(16, np.int8)
    mask[[3, 11]] = 1
    actions = {policy.act(np.array([0.5, 1.0], np.float32), deterministic=False,
                          action_mask=mask) for _ in range(50)}
    print("sampled actions under the mask [3, 11]:", sorted(actions))
    assert actions <= {3, 11}
