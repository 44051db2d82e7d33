"""The trajectory key vocabulary, defined once.

| container    | key                 | shape       | meaning                                     |
|--------------|---------------------|-------------|---------------------------------------------|
| info         | ``agent_info/<k>``  | (B, ...)    | agent parameters of the row (epsilon, ...)  |
| info         | ``env_info/<k>``    | (B, ...)    | env parameters passed at reset              |
| info         | ``agent_state/<k>`` | (B, ...)    | agent state at the start of the segment     |
| info         | ``env_id``          | (B,)        | global index of the env of the row          |
| info         | ``policy_version``  | (B,)        | number of ``update`` calls the row saw      |
| trajectories | ``observation/<k>`` | (B, T, ...) | what the agent saw at t (+ initial_state)   |
| trajectories | ``action/<k>``      | (B, T, ...) | everything the agent returned at t          |
| trajectories | ``_observation/<k>``| (B, T, ...) | the env's answer: next obs, reward, flags   |
| trajectories | ``lengths``         | (B,)        | valid steps per row                         |

``_observation/*`` at an episode end holds the TRUE final observation, never a reset observation.
``terminated`` (no bootstrap) and ``truncated`` (bootstrap from the final observation) stay apart;
``done`` is their OR.

The full keys that algorithms read from ``trajectories`` are spelt once below (``OBS_FRAME`` is
``"observation/frame"``, ``NEXT_REWARD`` is ``"_observation/reward"``, ``STORED_LOGP`` is
``"action/logp"``...): a loss writes ``steps[K.NEXT_REWARD]``, never the concatenation.

Example:
    >>> STORED_ACTION, NEXT_FRAME
    ('action/action', '_observation/frame')
"""

from __future__ import annotations

# Prefixes of the info DictTensor.
AGENT_INFO = "agent_info/"
ENV_INFO = "env_info/"
AGENT_STATE = "agent_state/"
ENV_ID = "env_id"
POLICY_VERSION = "policy_version"
# Prefixes of the trajectories TemporalDictTensor.
OBSERVATION = "observation/"
ACTION = "action/"
NEXT_OBSERVATION = "_observation/"
LENGTHS = "lengths"

# Leaf keys an environment writes into every observation.
FRAME = "frame"
REWARD = "reward"
TERMINATED = "terminated"
TRUNCATED = "truncated"
DONE = "done"
INITIAL_STATE = "initial_state"
LAST_ACTION = "last_action"
ENV_STEP = "env_step"
# The legal actions of a Discrete action space, where the env gives them (a leaf of a Dict
# observation, or gymnasium's ``info``): bool ``(A,)`` per env, True where the action is legal.
ACTION_MASK = "action_mask"
# Leaf key the agent must return.
ACTION_KEY = "action"

ENV_KEYS = (REWARD, TERMINATED, TRUNCATED, DONE, INITIAL_STATE, LAST_ACTION, ENV_STEP)
# Leaf keys the agents of rlstruct.blocks.sampling return besides the action.
LOGP = "logp"
VALUE = "value"
SAMPLE = "sample"  # a policy head's unclipped sample (PolicyAgent), where the log-prob is taken

# Full keys of the trajectories TemporalDictTensor, as losses read them.
OBS_FRAME = OBSERVATION + FRAME
OBS_INITIAL_STATE = OBSERVATION + INITIAL_STATE
NEXT_FRAME = NEXT_OBSERVATION + FRAME
NEXT_REWARD = NEXT_OBSERVATION + REWARD
NEXT_TERMINATED = NEXT_OBSERVATION + TERMINATED
NEXT_TRUNCATED = NEXT_OBSERVATION + TRUNCATED
STORED_ACTION = ACTION + ACTION_KEY
STORED_LOGP = ACTION + LOGP
STORED_VALUE = ACTION + VALUE
STORED_SAMPLE = ACTION + SAMPLE
OBS_ACTION_MASK = OBSERVATION + ACTION_MASK
NEXT_ACTION_MASK = NEXT_OBSERVATION + ACTION_MASK
