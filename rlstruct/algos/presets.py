"""The algorithms' presets (``--preset NAME``): published, tested hyperparameter sets.

Each is a :class:`~rlstruct.runs.presets.Preset` that an algorithm's ``Config.presets`` lists;
docs/algorithms.md's preset table gives each one's measured result and the command behind it.
Sources: rl-zoo (DLR-RM/rl-baselines3-zoo, ``hyperparams/*.yml``) and CleanRL
(``ppo_atari.py``). Where rlstruct's nets differ from theirs the comment of the preset says so.
"""

from __future__ import annotations

from rlstruct.runs.presets import Preset

__all__ = ["PPO_PRESETS", "APPO_PRESETS", "IMPALA_PRESETS", "DQN_PRESETS", "SAC_PRESETS",
           "TRPO_PRESETS"]

#: rl-zoo's and CleanRL's Atari settings (8 envs, T=128, 4 epochs of 4 minibatches of 256, lr
#: 2.5e-4 annealed, clip 0.1) with the Nature CNN, laid out for 2 cores: the workers collect,
#: then the learner learns on both cores (2 threads, bfloat16 where the CPU or GPU has it).
#: Learning while the workers collect (--pipeline 2) was slower on 2 cores: 2 learner threads
#: and 2 workers on 2 cores stall the learner's parallel kernels (docs/guide-atari.md). Atari's
#: measure is the training episodes' return (rlstruct evaluate RUN_DIR afterwards).
PPO_ATARI = Preset(
    "Atari (ALE/Pong-v5 unless --env-id): Nature CNN, rl-zoo's and CleanRL's PPO settings",
    dict(env_id="ALE/Pong-v5", env_backend="atari", model="cnn", n_processes=2, n_envs=4,
         n_timesteps=128, n_epochs=4, minibatch_size=256, lr=2.5e-4, anneal_lr=True,
         clip_coef=0.1, ent_coef=0.01, vf_coef=0.5, gamma=0.99, gae_lambda=0.95,
         max_grad_norm=0.5, adv_norm="minibatch", target_return=None, max_frames=10_000_000,
         time_budget=86_400.0, eval_every=0, checkpoint_every=100, n_threads=2, pipeline=1,
         precision="auto"),
)

#: MuJoCo locomotion, obs and reward normalisation everywhere. HalfCheetah (and other Box tasks)
#: and Walker2d: rl-zoo's tuned settings (HalfCheetah: 256-wide ReLU nets with torch's default
#: init, ``ortho_init=False``, log-std -2; Walker2d: SB3's default 64-wide tanh net). SB3's value
#: loss is ``(V - R)^2`` and rlstruct's ``0.5 (V - R)^2``: each ``vf_coef`` is twice rl-zoo's.
#: Hopper: CleanRL's ``ppo_continuous_action.py`` (2048 steps, 10 epochs of 64, lr 3e-4
#: annealed, value clipping, 64-wide tanh): rl-zoo's Hopper-v3 values stand still at the alive
#: bonus (about 1,000) on Hopper-v5, in SB3 2.9.2 as in rlstruct (docs/algorithms.md). Its one
#: change, gamma 0.995 (CleanRL 0.99, rl-zoo 0.999): with the alive bonus, the discount sets what
#: a fall costs against speed. At 0.99 seed 0 leans into a faster and faster gait that falls at
#: about 310 steps (974 at 1M); at 0.999 the same seed stands still at 987 from 100k frames on.
PPO_MUJOCO = Preset(
    "MuJoCo (HalfCheetah-v5 unless --env-id): rl-zoo's PPO settings per task",
    dict(env_id="HalfCheetah-v5", max_frames=1_000_000, time_budget=3_600.0, target_return=None,
         n_processes=1, n_envs=1, n_timesteps=512, minibatch_size=64, n_epochs=20, lr=2.0633e-5,
         gamma=0.98, gae_lambda=0.92, clip_coef=0.1, ent_coef=4.01762e-4, vf_coef=2 * 0.58096,
         max_grad_norm=0.8, hidden=256, activation="relu", log_std_init=-2.0, init="torch",
         normalize_obs=True, normalize_reward=True, anneal_lr=False, eval_every=0,
         checkpoint_every=200),
    per_env={  # HalfCheetah learns while its worker collects: 3 seeds in 14-15 minutes each
        "HalfCheetah-v5": dict(n_processes=1, pipeline=2),
        "Hopper-v5": dict(n_timesteps=2048, minibatch_size=64, n_epochs=10, lr=3e-4,
                          anneal_lr=True, gamma=0.995, gae_lambda=0.95, clip_coef=0.2,
                          value_clip=0.2, ent_coef=0.0, vf_coef=0.5, max_grad_norm=0.5,
                          hidden=64, activation="tanh", log_std_init=0.0, init="orthogonal"),
        "Walker2d-v5": dict(n_timesteps=512, minibatch_size=32, n_epochs=20, lr=5.05041e-5,
                            gamma=0.99, gae_lambda=0.95, clip_coef=0.1, ent_coef=5.85045e-4,
                            vf_coef=2 * 0.871923, max_grad_norm=1.0, hidden=64,
                            activation="tanh", log_std_init=0.0, init="orthogonal"),
    },
)

#: CleanRL's ``ppo_atari_lstm.py`` (vwxyzjn/cleanrl, cleanrl/ppo_atari_lstm.py): 8 envs x 128
#: steps, lr 2.5e-4 annealed, 4 epochs of 4 minibatches (2 whole env rows each), gamma 0.99,
#: GAE lambda 0.95, clip 0.1, value clipping at the same 0.1 (``clip_vloss``), ent 0.01, vf 0.5,
#: max grad norm 0.5, advantages normalised per minibatch, 10M frames; ONE 84x84 frame per
#: observation (its ``FrameStack(1)``) through the Nature CNN's 512 features, an LSTM of 128 and
#: the actor and critic heads (``--model cnn-lstm``, rlstruct/blocks/zoo.py). CleanRL's default
#: env is Breakout; its published Pong figure (19.78 at 10M) is on PongNoFrameskip-v4, the env
#: here. Laid out as PPO_ATARI for 2 cores: 2 workers of 4 envs collect, then the learner
#: learns on both cores (2 threads, the CNN in bfloat16 where the CPU has it, the cell and heads
#: in float32).
PPO_ATARI_LSTM = Preset(
    "Atari (PongNoFrameskip-v4 unless --env-id): one frame, Nature CNN + LSTM 128, CleanRL's "
    "ppo_atari_lstm settings",
    dict(env_id="PongNoFrameskip-v4", env_backend="atari", frame_stack=1, model="cnn-lstm",
         hidden=128, n_processes=2, n_envs=4, n_timesteps=128, n_epochs=4, n_minibatches=4,
         minibatch_size=256, lr=2.5e-4, anneal_lr=True, clip_coef=0.1, value_clip=0.1,
         ent_coef=0.01, vf_coef=0.5, gamma=0.99, gae_lambda=0.95, max_grad_norm=0.5,
         adv_norm="minibatch", target_return=None, max_frames=10_000_000, time_budget=172_800.0,
         eval_every=0, checkpoint_every=100, n_threads=2, pipeline=1, precision="auto"),
)

#: The big batch for machines with many cores (issue 41): PPO_ATARI's settings (CleanRL's and
#: rl-zoo's: lr 2.5e-4 annealed, clip 0.1, 4 epochs, entropy 0.01, gamma 0.99, GAE 0.95) with 60
#: envs in all instead of 8 and T=64 instead of 128: 3,840 steps an iteration, in 15 minibatches
#: of 256 (each step in 4 epochs of minibatches of 256, as in PPO_ATARI: as many gradient steps
#: a sample). Big batches on Pong were shown by rl_games (Denys88/rl_games,
#: configs/atari/ppo_pong_envpool.yaml: 24 envs x 256 steps, minibatches of 768, 3 epochs, lr
#: 3e-4 with a KL-adaptive schedule and value normalisation, neither of which rlstruct has).
#: 60 envs divide among 2, 3, 4, 5, 6, 10, 12, 15, 20 or 30 workers, so ``--layout auto`` fills
#: 16 cores (15 workers of 4 beside a GPU learner) as it fills 2 (2 workers of 30, then the
#: learner on both cores: the layout below). The learning rate anneals over PPO_ATARI's 10M
#: steps (``--max-frames``; stop earlier with ``--target-return 18``): annealed over 2M until
#: 2026-12-07, seeds 1 and 2 stood at 8-13 by 1.5M, and seed 1 over 10M reached 18 at 1.40M.
#: Its sample efficiency is measured on the 2 cores (docs/results.md), its speed on a GPU node
#: by ``make gpu-scale``.
PPO_ATARI_FAST = Preset(
    "Atari for many cores (PongNoFrameskip-v4 unless --env-id): 60 envs x T=64, PPO's Atari "
    "settings otherwise; use with --layout auto",
    {**PPO_ATARI.values, "env_id": "PongNoFrameskip-v4", "n_processes": 2, "n_envs": 30,
     "n_timesteps": 64, "minibatch_size": 256},
)

#: PPO's presets: ``--preset atari``, ``atari-fast``, ``atari-lstm`` and ``mujoco``.
PPO_PRESETS = {"atari": PPO_ATARI, "atari-fast": PPO_ATARI_FAST, "atari-lstm": PPO_ATARI_LSTM,
               "mujoco": PPO_MUJOCO}

#: APPO on Atari: PPO's Atari settings (CleanRL's ``ppo_atari.py`` and rl-zoo's ``ppo.yml``
#: ``atari`` entry: 8 envs, T=128, 4 epochs of minibatches of 256, lr 2.5e-4 annealed, clip 0.1,
#: entropy 0.01, gamma 0.99), on PongNoFrameskip-v4 as those two run Atari (NoFrameskip-v4 ids),
#: with V-trace targets instead of GAE (APPO's own, so no published APPO run is reproduced).
#: APPO always pipelines: the workers collect while the learner learns. On Pong's CNN the
#: learner sets the pace, so it takes 2 threads: 312 agent steps/s at 2.0 cores busy against 219
#: at 1.2 with one on the 2-core machine (docs/results.md, "APPO and IMPALA on 2 cores").
APPO_PRESETS = {"atari": Preset(
    "Atari (PongNoFrameskip-v4 unless --env-id): Nature CNN, PPO's Atari settings with V-trace",
    dict(env_id="PongNoFrameskip-v4", env_backend="atari", model="cnn", n_processes=2, n_envs=4,
         n_timesteps=128, n_epochs=4, minibatch_size=256, lr=2.5e-4, anneal_lr=True,
         clip_coef=0.1, ent_coef=0.01, vf_coef=0.5, gamma=0.99, max_grad_norm=0.5,
         target_return=None, max_frames=10_000_000, time_budget=86_400.0, eval_every=0,
         checkpoint_every=100, n_threads=2, pipeline=2, precision="auto"),
)}

#: IMPALA on Atari: TorchBeast's MonoBeast defaults (facebookresearch/torchbeast,
#: ``torchbeast/monobeast.py``): batches of 8 unrolls of 80 steps, RMSprop lr 4.8e-4 (alpha
#: 0.99, eps 0.01, no momentum) decayed linearly to 0, entropy cost 0.0006, baseline cost 0.5,
#: gamma 0.99, gradients clipped at a norm of 40, rewards clamped to [-1, 1], V-trace with
#: rho_bar = c_bar = 1, the losses SUMMED over the batch (not averaged), no advantage
#: normalisation, on PongNoFrameskip-v4. MonoBeast's 4 actors become 2 workers of 4 envs (the
#: 8 rows of a batch) beside the learner thread on 2 cores, which takes 2 torch threads (707
#: agent steps/s against 606 with one: docs/results.md). Differences: the net is the Nature
#: CNN with actor and critic heads on its 512 features (MonoBeast's AtariNet has the same
#: trunk but also feeds the last action and clipped reward to its heads); the optimizer is
#: ``torch.optim.RMSprop``, MonoBeast's own (the IMPALA paper's TensorFlow RMSprop puts eps
#: inside the square root); MonoBeast decays the rate over ``--total_steps`` (its default of
#: 100k is a smoke value; its README's Pong run takes 30M), here over max_frames, 10M as the
#: other Atari presets. Measured: at 1.5M agent steps on Pong (seed 0) the policy had not moved
#: from uniform; one update per 640 steps is too few for the 6M budget (docs/results.md, "IMPALA
#: on Pong: why the policy does not move").
IMPALA_PRESETS = {"atari": Preset(
    "Atari (PongNoFrameskip-v4 unless --env-id): Nature CNN, TorchBeast MonoBeast's settings",
    dict(env_id="PongNoFrameskip-v4", env_backend="atari", model="cnn", n_processes=2,
         n_envs=4, n_timesteps=80, lr=4.8e-4, optimizer="rmsprop", anneal_lr=True,
         reduction="sum", ent_coef=0.0006, vf_coef=0.5, gamma=0.99, max_grad_norm=40.0,
         clip_reward=True, rho_bar=1.0, c_bar=1.0, normalize_advantages=False,
         target_return=None, max_frames=10_000_000, time_budget=604_800.0, eval_every=0,
         checkpoint_every=500, n_threads=2, pipeline=2, queue=1, precision="auto"),
)}

#: DQN on Atari: CleanRL's ``dqn_atari.py`` (10M frames, lr 1e-4, a buffer of 1M, batches of 32,
#: one gradient step per 4 frames, a hard target copy every 1,000 frames, epsilon 1 -> 0.01 over
#: the first 1M frames, learning from 80k frames, no double Q); rl-zoo's ``dqn.yml`` ``atari`` is
#: the same but for its buffer (100k) and start (100k). The buffer stores each frame once
#: (FrameReplayBuffer: 1M transitions in about 7.2 GB). 8 envs in 2 workers collect segments of
#: 32 steps while the learner takes their 64 gradient steps; the target copy every 250 gradient
#: steps is CleanRL's 1,000 frames. Gradients clipped at 10 as SB3's DQN does. The CNN trunk in
#: bfloat16 where the CPU has it (``--precision auto``; the Q head in float32). The learner sets
#: the pace (a gradient step is about 30 ms on a core): 2 learner threads beside the workers made
#: 203 frames/s with 2.0 cores busy on the 2-core machine, 1 thread 130-140 with 1.1. 10M frames
#: still take about 14 hours: the time budget is a week, a guard.
DQN_PRESETS = {"atari": Preset(
    "Atari (PongNoFrameskip-v4 unless --env-id): Nature CNN, CleanRL's DQN settings",
    dict(env_id="PongNoFrameskip-v4", env_backend="atari", model="cnn", n_processes=2,
         n_envs=4, n_timesteps=32, buffer_size=1_000_000, lr=1e-4, batch_size=32,
         updates_per_batch=64, target_update_every=250, tau=1.0, double=False, dueling=False,
         eps_start=1.0, eps_end=0.01, eps_frames=1_000_000, learning_starts=80_000,
         gamma=0.99, max_grad_norm=10.0, target_return=None, max_frames=10_000_000,
         time_budget=604_800.0, eval_every=0, checkpoint_every=2_000, n_threads=2,
         precision="auto"),
)}

#: SAC on MuJoCo: rl-zoo's settings (SB3's SAC defaults, 10k frames before learning): 256-wide
#: nets, lr 3e-4, batches of 256, tau 0.005, one gradient step per frame from one env. Laid out
#: for 2 cores: one worker process plays the env while the learner takes its gradient step on 2
#: threads (--pipeline 2: the frame is played with the weights one update old, SB3 plays it with
#: the newest). On the 2-core machine (benchmarks/sac_peers.py, 2026-12-06, one quiet run each)
#: 91.9 frames/s, against 83.9 collecting in this process and 50.6 before this wave's speed work
#: (1 thread, weights published through torch.save); SB3 made 78-104 in the same hour. The
#: critic's loss and the policy's back-propagate at once on the 2 threads (--concurrent-losses;
#: 2026-12-07: 103.4 frames/s on 1.73 cores against 84.7-86.1 without, SB3 75.3 in the same
#: run). The time budget is a day, a guard rather than the stop (1M frames: about 2.7 hours).
SAC_PRESETS = {"mujoco": Preset(
    "MuJoCo (Hopper-v5 unless --env-id): rl-zoo's SAC settings",
    dict(env_id="Hopper-v5", max_frames=1_000_000, time_budget=86_400.0, target_return=None,
         n_processes=1, n_envs=1, pipeline=2, n_timesteps=1, hidden=256, lr=3e-4, batch_size=256,
         buffer_size=1_000_000, learning_starts=10_000, tau=0.005, gamma=0.99, utd=1.0,
         init_alpha=1.0, max_grad_norm=0.0, eval_every=0, checkpoint_every=20_000, n_threads=2,
         concurrent_losses=True),
)}

#: TRPO on MuJoCo: rl-zoo's settings (``hyperparams/trpo.yml``, its MuJoCo defaults: 2 envs x
#: 1024 steps, 20 critic epochs of 128, CG of 25 steps, damping 0.1, KL bound 0.01, 0.04 on
#: HalfCheetah; ``normalize: true``, which is SB3's ``VecNormalize`` of observations AND rewards).
#: Until 2026-12-07 the preset normalised observations only (docs/results.md gives both).
TRPO_PRESETS = {"mujoco": Preset(
    "MuJoCo (HalfCheetah-v5 unless --env-id): rl-zoo's TRPO settings",
    dict(env_id="HalfCheetah-v5", max_frames=1_000_000, time_budget=3_600.0,
         target_return=None, n_processes=2, n_envs=1, n_timesteps=1024, hidden=64, lr=1e-3,
         gamma=0.99, gae_lambda=0.95, cg_iters=25, cg_damping=0.1, max_kl=0.01,
         critic_epochs=20, minibatch_size=128, normalize_obs=True, normalize_reward=True,
         eval_every=0, checkpoint_every=100),
    per_env={"HalfCheetah-v5": dict(max_kl=0.04)},
)}

#: A2C on Atari: rl-zoo's ``hyperparams/a2c.yml`` ``atari`` (16 envs, 4 stacked frames,
#: ``ent_coef`` 0.01, ``vf_coef`` 0.25, ``RMSpropTFLike`` with eps 1e-5, 10M frames) over SB3's
#: A2C defaults (lr 7e-4, 5 steps, gamma 0.99, GAE lambda 1, gradients clipped at 0.5, RMSprop
#: alpha 0.99, advantages not normalised), the Nature CNN. rlstruct's A2C value loss is SB3's,
#: the mean of ``(V - R)^2`` (not PPO's half of it): ``vf_coef`` is rl-zoo's as it stands.
#: ``--optimizer rmsprop`` is RMSprop as TensorFlow has it (rlstruct/blocks/optim.py: eps inside
#: the square root, the square average starting at ones). Laid out for 2 cores as PPO's preset:
#: 2 workers x 8 envs collect, then the learner learns on both cores (no policy lag, as in SB3).
A2C_PRESETS = {"atari": Preset(
    "Atari (PongNoFrameskip-v4 unless --env-id): Nature CNN, rl-zoo's A2C settings",
    dict(env_id="PongNoFrameskip-v4", env_backend="atari", model="cnn", frame_stack=4,
         n_processes=2, n_envs=8, n_timesteps=5, lr=7e-4, optimizer="rmsprop", gamma=0.99,
         gae_lambda=1.0, ent_coef=0.01, vf_coef=0.25, max_grad_norm=0.5,
         normalize_advantages=False, target_return=None, max_frames=10_000_000,
         time_budget=86_400.0, eval_every=0, checkpoint_every=2_000, n_threads=2, pipeline=1,
         precision="auto"),
)}
