"""Tutorial 02 — TemporalDictTensor and Trajectories: batches of segments of different lengths.

A batcher hands you B rows of at most T steps each. Episodes end at different times, so every row
carries its own valid length and the steps after it are padding. This tutorial builds such a batch
by hand and shows every way to read it: masks, slices in time, one step, the last step, the flat
list of transitions, concatenation and sampling.

The runnable companion of one page, which explains it and links here:
[Concepts](../docs/concepts.md#the-containers-and-their-invariants).

Run: python tutorials/02_temporal.py   (finishes in about a second on a CPU)
"""

import torch

from rlstruct import DictTensor, TemporalDictTensor, Trajectories
from rlstruct import functional as F

# Three episodes of lengths 4, 2 and 3, stored in a (B=3, T=4) batch. The keys follow the schema
# of rlstruct.keys: what the agent saw is under "observation/", what it did under "action/" and
# the env's answer (reward, flags, next observation) under "_observation/".
B, T = 3, 4
lengths = torch.tensor([4, 2, 3])
steps = TemporalDictTensor(
    {
        "observation/frame": torch.arange(B * T, dtype=torch.float32).reshape(B, T, 1),
        "action/action": torch.tensor([[0, 1, 1, 0], [1, 1, 0, 0], [0, 0, 1, 0]]),
        "_observation/reward": torch.ones(B, T),
    },
    lengths,
)
print(steps)
print("lengths:", steps.lengths.tolist(), " T =", steps.n_timesteps())

# mask() is the (B, T) truth of "this step is real". Every loss over a batch is masked with it:
# padding holds whatever the buffer last had (here the rewards are 1 everywhere).
mask = steps.mask()
print("\nmask():\n", mask)
reward = steps["_observation/reward"]
print("reward summed naively:", reward.sum().item(), "| over valid steps:",
      reward[mask].sum().item())
print("mean reward per valid step:", F.masked_mean(reward, mask).item())

# temporal_slice(a, b) cuts a window in time; lengths are clipped into the window, so a row that
# ended before the window has length 0 there.
window = steps.temporal_slice(2, 4)
print("\nsteps 2..3 of every row: lengths", window.lengths.tolist(), "T =", window.n_timesteps())

# temporal_index(t) is step t of every row as a DictTensor (B, ...), padding rows included;
# masked_temporal_index(t) also says which rows really have a step t.
at3, valid3 = steps.masked_temporal_index(3)
print("\nframes at t=3:", at3["observation/frame"].flatten().tolist(), "valid:", valid3.tolist())
print("the real ones only:", at3.index(valid3)["observation/frame"].flatten().tolist())

# last() picks each row's own last valid step: the final frame of each episode.
print("\nlast frame of each row:", steps.last()["observation/frame"].flatten().tolist())

# to_transitions() drops the padding and flattens (B, T) into sum(lengths) rows: the shape a
# replay buffer or a supervised loss wants.
transitions = steps.to_transitions()
print("to_transitions():", transitions.n_elems(), "transitions, frames",
      transitions["observation/frame"].flatten().tolist())

# Segments from two batchers (or two calls) rarely share T. cat pads the shorter ones in time
# with zeros of each key's dtype; their lengths keep the padding out of every mask.
short = TemporalDictTensor(
    {
        "observation/frame": torch.full((2, 2, 1), -1.0),
        "action/action": torch.zeros(2, 2, dtype=torch.long),
        "_observation/reward": torch.zeros(2, 2),
    },
    torch.tensor([2, 1]),
)
both = TemporalDictTensor.cat([steps, short])
print("\ncat of T=4 and T=2 rows: B =", both.n_elems(), "T =", both.n_timesteps(),
      "lengths", both.lengths.tolist())
print("the dtype of action/action is kept:", both["action/action"].dtype)

# Trajectories pair per-row info (what held at the start of each segment: env_id, agent_info,
# agent_state) with the steps. Indexing and sampling keep both halves aligned.
info = DictTensor(
    {"env_id": torch.tensor([10, 11, 12]), "agent_info/epsilon": torch.tensor([0.0, 0.1, 0.5])}
)
traj = Trajectories(info, steps)
print("\n", traj, sep="")
drawn = traj.sample(2, generator=torch.Generator().manual_seed(0))
print("\nsample(2): env_ids", drawn.info["env_id"].tolist(), "with lengths", drawn.lengths.tolist())
eps_big = traj.index(traj.info["agent_info/epsilon"] > 0.05)
print("rows explored with epsilon > 0.05: env_ids", eps_big.info["env_id"].tolist())
