"""Tutorial 13 — Dict observations: an image and a vector, one multi-input model.

``rlstruct/Dict-v0`` observes ``{"image": uint8 (3, 16, 16), "vector": float32 (4,)}``; its
reward needs both keys (the lit half of the image XOR the sign of the vector's first entry), so
a policy blind to either earns half the optimum. The tutorial shows the three things that make
Dict observations work, then trains PPO from Python and acts with the trained policy:

1. The env layer writes one observation key per leaf, each in its own dtype: the trajectories
   hold ``observation/image`` as uint8 (no float copy) and ``observation/vector`` as float32.
2. A model reads ``model_input(observation)``: the feature keys (every leaf but ``reward``,
   ``done``... and ``action_mask``) as a dict of tensors; for a one-array env it is the
   ``frame`` tensor itself.
3. ``model_factory(obs_spec(space), make, ...)`` puts the algorithm's usual network behind a
   ``MultiInputEncoder``: a CNN per image key (uint8 divided by 255 inside), the vectors
   flattened, features concatenated. ``rlstruct train <algo>`` does this by itself.

The runnable companion of one page, which explains it and links here:
[Algorithms: Dict observations](../docs/algorithms.md#dict-observations).

Run: python tutorials/14_dict_observations.py   (about 20 seconds on a CPU)
"""

import tempfile

import gymnasium as gym

import rlstruct
from rlstruct import SerialBatcher
from rlstruct.algos import ppo
from rlstruct.blocks.distributions import space_spec
from rlstruct.blocks.multi_input import feature_size, model_factory, obs_spec
from rlstruct.blocks.obs_input import model_input
from rlstruct.blocks.sampling import PolicyAgent
from rlstruct.blocks.zoo import actor_critic
from rlstruct.envs import GymEnvInf
from rlstruct.envs.debug import DICT_ID
from rlstruct.runs.layout import LayoutConfig


def main() -> None:
    env = gym.make(DICT_ID)
    spec = obs_spec(env.observation_space)
    print("feature keys:", {k: (s["kind"], s["shape"]) for k, s in spec.items()})

    # 3. The zoo's MLP actor-critic on F features, behind a CNN (image) and the vector.
    make = model_factory(spec, actor_critic, "mlp", (feature_size(spec),),
                         space_spec(env.action_space), 64)
    model = make()
    print(f"encoder: {feature_size(spec)} features; inner network: {type(model.inner).__name__}")

    # 1. Collect a segment: each key keeps its dtype in the trajectories.
    with SerialBatcher(8, PolicyAgent, {"model": model}, GymEnvInf,
                       {"env": DICT_ID, "n_envs": 4}, seeds=0) as batcher:
        batcher.reset()
        batcher.execute()
        traj, _ = batcher.get()
    steps = traj.trajectories
    for key in ("observation/image", "observation/vector"):
        print(f"{key}: {tuple(steps[key].shape)} {steps[key].dtype}")

    # 2. What the model reads: a dict of the feature keys, the image still uint8.
    x = model_input(steps, "observation/")[:, 0]
    params, value = model(x)
    print("model_input keys:", sorted(x), "| image dtype:", x["image"].dtype,
          "| params", tuple(params.shape), "value", tuple(value.shape))

    # Train PPO on it (the command line: rlstruct train ppo --env-id rlstruct/Dict-v0).
    with tempfile.TemporaryDirectory() as runs:
        summary = ppo.main(ppo.Config(env_id=DICT_ID, max_frames=8192, target_return=7.0,
                                      runs_dir=runs, layout=LayoutConfig(n_processes=1)))
        print(f"PPO: {summary['stopped_by']} after {summary['frames']} frames, mean return "
              f"{summary['train_return_mean20']:.2f} of 8 (a policy blind to a key: 4)")
        policy = rlstruct.load_policy(summary["run_dir"])
        obs, _ = env.reset(seed=1)
        total = 0.0
        for _ in range(8):
            obs, reward, *_ = env.step(policy.act(obs))
            total += float(reward)
        print(f"load_policy(...).act on Dict observations: return {total:.0f} of 8")


if __name__ == "__main__":
    main()
