"""The run scaffold every algorithm is written with: :class:`~rlstruct.runs.run.Run` and its
config (:mod:`.config`), device layouts and the batchers built from them (:mod:`.layout`), the
run folder's outputs (:mod:`.logger`, :mod:`.checkpoint`, :mod:`.folder`, :mod:`.plotting`),
the resource monitor (:mod:`.monitor`), evaluation in a worker process (:mod:`.evaluator`) and
episode returns by env (:mod:`.episodes`)."""
