"""Tutorial 01 — DictTensor and TemporalDictTensor, the containers that carry every batch.

The runnable companion of one page, which explains it and links here:
[Concepts](../docs/concepts.md#the-containers-and-their-invariants).

Run: python tutorials/01_dicttensor.py   (finishes in well under a second on a CPU)
"""

import torch

from rlstruct import DictTensor, TemporalDictTensor, Trajectories, masked_dicttensor
from rlstruct.errors import ShapeError

# A DictTensor is a dict of tensors that share their first (batch) dimension and their device.
obs = DictTensor({"frame": torch.randn(4, 3), "lives": torch.tensor([3, 3, 2, 1])})
print("a batch of 4 observations:\n", obs)

# The invariant is enforced on every write: the error names the key and both sizes.
try:
    obs["bad"] = torch.zeros(5)
except ShapeError as e:
    print("\nrefused:", e)

# Rows are selected with index (LongTensor, ints or a bool mask) and slice; the batch dim stays.
alive = obs["lives"] > 1
print("\nrows with more than one life:", obs.index(alive)["lives"].tolist())
print("row 2 keeps its batch dim:", tuple(obs.slice(2)["frame"].shape))

# Row-wise choice between two DictTensors, exact for integer dtypes.
reset_obs = DictTensor({"frame": torch.zeros(4, 3), "lives": torch.full((4,), 5)})
print("after resetting the dead rows:", masked_dicttensor(obs, reset_obs, ~alive)["lives"].tolist())

# A TemporalDictTensor adds a time axis (B, T, ...) and the valid length of each row.
steps = TemporalDictTensor(
    {"reward": torch.arange(12.0).reshape(3, 4)}, lengths=torch.tensor([4, 2, 0])
)
print("\nvalid steps:\n", steps.mask())
print("last valid reward of the first two rows:", steps.slice(0, 2).last()["reward"].tolist())
print("the valid transitions only:", steps.to_transitions()["reward"].tolist())

# Trajectories pair per-row info (at segment start) with the steps.
info = DictTensor({"env_id": torch.arange(3)})
traj = Trajectories(info, steps)
print("\nTrajectories of", traj.n_elems(), "rows on", traj.device())
