"""The learning parts the algorithms share: returns, GAE, TD targets and V-trace
(:mod:`.functional`, :mod:`.policy_terms`), policy heads (:mod:`.distributions`), networks
(:mod:`.nets`), observation statistics (:mod:`.normalization`), optimizers and the gradient
step (:mod:`.optim`), seeded sampling agents (:mod:`.sampling`) and the replay buffer
(:mod:`.replay_buffer`).

``from rlstruct import functional as F`` keeps working: the package exports it."""
