"""Tutorial 12 — A recurrent agent: its memory through the batcher, the replay and the bootstrap.

CartPole without its velocities (``rlstruct/CartPoleNoVel-v1`` observes the cart's position and
the pole's angle only) needs a memory: a policy must recover the velocities from successive
observations. This tutorial writes a recurrent agent on the public API, with its own small GRU
(not the model zoo), and follows its state everywhere it goes:

1. ``initial_state`` gives the state of fresh rows; the agent restarts a row from it where
   ``observation["initial_state"]`` is true (an episode's first step);
2. the batcher stores the state each row had at the START of every segment in
   ``info["agent_state/h"]``: with auto-reset envs a segment begins in the middle of episodes;
3. ``replay_agent`` restarts from that stored state and steps through the segment WITH
   gradients: it reproduces what the acting agent computed (checked below, bit for bit);
4. a segment cut in the middle of an episode is bootstrapped with the value of its last true
   next observation, valued under the state AFTER the last step (the agent returns it as ``h``,
   stored as ``action/h``); so is an episode's end inside the segment;
5. a few A2C updates (advantage actor-critic with GAE) on CartPoleNoVel.

The runnable companion of one page, which explains it and links here:
[Models and memory](../docs/guide-recurrent.md#the-state-step-by-step).

Run: python tutorials/12_recurrent_agent.py   (about 15 seconds on a CPU)
"""

import time

import torch
from torch import nn

from rlstruct import Agent, DictTensor, SerialBatcher, masked_dicttensor, replay_agent
from rlstruct import functional as F
from rlstruct.blocks.recurrent import bootstrap_values
from rlstruct.envs import CARTPOLE_NOVEL_ID, GymEnvInf

HIDDEN = 32
N_ENVS = 8
T = 32
ITERATIONS = 150
GAMMA, LAM, LR = 0.99, 0.95, 3e-3
SEED = 0


class GRUActorCritic(nn.Module):
    """``forward(frame (n, 2), h (n, H)) -> (logits (n, 2), value (n,), h' (n, H))``."""

    def __init__(self, obs_dim: int = 2, n_actions: int = 2, hidden: int = HIDDEN) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh())
        self.cell = nn.GRUCell(hidden, hidden)
        self.actor = nn.Linear(2 * hidden, n_actions)
        self.critic = nn.Linear(2 * hidden, 1)

    def forward(self, frame, h):
        x = self.encoder(frame)
        h = self.cell(x, h)
        features = torch.cat([x, h], -1)  # the current observation and the memory
        return self.actor(features), self.critic(features).squeeze(-1), h

    def value(self, frame, h):
        return self(frame, h)[1]


class GRUAgent(Agent):
    """Samples from the GRU's policy; its state is ``{"h": (n, H)}``."""

    def __init__(self, model: GRUActorCritic) -> None:
        self.model = model
        self.generator = torch.Generator()

    def seed(self, seed: int) -> None:
        self.generator.manual_seed(seed)

    def initial_state(self, agent_info, n):
        return DictTensor({"h": torch.zeros(n, self.model.cell.hidden_size)})

    def step(self, state, observation):
        # The memory restarts where an episode starts, during acting and replay alike.
        fresh = self.initial_state(DictTensor(), observation.n_elems())
        state = masked_dicttensor(state, fresh, observation["initial_state"])
        return self.model(observation["frame"], state["h"])

    def __call__(self, state, observation, agent_info):
        logits, value, h = self.step(state, observation)
        action = torch.multinomial(logits.softmax(-1), 1, generator=self.generator).squeeze(-1)
        out = {"action": action, "logp": logits.log_softmax(-1).gather(-1, action[:, None])[:, 0],
               "value": value, "h": h}  # h: the state after the step, stored as action/h
        return DictTensor(out), DictTensor({"h": h})

    def call_replay(self, trajectories, t, state):
        # Replay samples nothing: it recomputes logits and values of the stored steps.
        observation = trajectories.trajectories.temporal_index(t).truncate_key("observation/")
        logits, value, h = self.step(state, observation)
        return DictTensor({"logits": logits, "value": value, "h": h}), DictTensor({"h": h})


def next_values(model, traj, value, h):
    """V' (B, T): the value of each step's TRUE next observation. Inside an episode it is the
    next step's value; at an episode's end and at the segment's last step the next observation
    is not the next step's (a new episode's, or not collected yet): the model values
    ``_observation/frame`` under ``h``, the state after the step."""
    steps = traj.trajectories
    ends = steps["_observation/terminated"] | steps["_observation/truncated"]
    ends[:, -1] = True  # the segment's cut
    next_value = torch.cat([value[:, 1:], value[:, -1:]], 1).detach().clone()
    with torch.no_grad():
        next_value[ends] = model.value(steps["_observation/frame"][ends], h[ends])
    return next_value


def main() -> None:
    torch.set_num_threads(1)  # tiny matrices: one thread, and the replay's maths is the acting's
    torch.manual_seed(SEED)
    model = GRUActorCritic()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    learner = GRUAgent(model)
    batcher = SerialBatcher(n_timesteps=T, create_agent=GRUAgent, agent_args={"model": model},
                            create_env=GymEnvInf,
                            env_args={"env": CARTPOLE_NOVEL_ID, "n_envs": N_ENVS}, seeds=SEED)
    started = time.perf_counter()
    finished: list[float] = []
    running = torch.zeros(N_ENVS)
    with batcher:
        batcher.reset()
        for iteration in range(ITERATIONS):
            batcher.execute()
            traj, _ = batcher.get()
            steps = traj.trajectories  # (B, T, ...): endless segments, every row T steps
            if iteration == 0:
                print("info keys:", sorted(traj.info.keys()))
                print("episodes starting inside the segment:",
                      int(steps["observation/initial_state"][:, 1:].sum()))

            # The replay starts from info["agent_state/h"] and resets at the episode starts.
            replayed = replay_agent(learner, traj)
            if iteration == 0:  # the weights have not moved yet: it is the acting agent's maths
                same = (torch.equal(replayed["h"], steps["action/h"])
                        and torch.equal(replayed["value"], steps["action/value"]))
                print("replay reproduces the collected h and value:", same)

            value = replayed["value"]
            next_value = next_values(model, traj, value, replayed["h"])
            if iteration == 0:  # the library's helper follows the same rule
                print("bootstrap_values agrees:", torch.allclose(
                    next_value, bootstrap_values(model, traj, value, replayed["h"])))
            advantage, returns = F.gae(steps["_observation/reward"], value.detach(), next_value,
                                       steps["_observation/terminated"],
                                       steps["_observation/truncated"], steps.lengths, GAMMA, LAM)
            log_probs = replayed["logits"].log_softmax(-1)
            logp = log_probs.gather(-1, steps["action/action"][..., None])[..., 0]
            entropy = -(log_probs.exp() * log_probs).sum(-1)
            loss = (-(logp * advantage).mean() + 0.5 * (returns - value).pow(2).mean()
                    - 0.01 * entropy.mean())
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            optimizer.step()
            batcher.update(model.state_dict())

            # Episode returns, from the rewards of the rows' steps.
            ends = steps["_observation/terminated"] | steps["_observation/truncated"]
            for t in range(T):
                running += steps["_observation/reward"][:, t]
                finished += running[ends[:, t]].tolist()
                running[ends[:, t]] = 0.0
            if iteration % 30 == 0 or iteration == ITERATIONS - 1:
                recent = finished[-20:]
                mean = sum(recent) / max(len(recent), 1)
                print(f"iteration {iteration:2d}: mean return {mean:6.1f} over the last "
                      f"{len(recent)} episodes, loss {loss.item():+.3f}")
    print(f"{ITERATIONS} iterations in {time.perf_counter() - started:.1f} s (a start: the task "
          "takes far more frames). The zoo does all this for you: "
          "rlstruct.blocks.recurrent.RecurrentAgent over --model mlp-lstm (or mlp-gru, cnn-lstm, "
          "cnn-gru) in A2C, PPO, IMPALA and APPO.")


if __name__ == "__main__":
    main()
