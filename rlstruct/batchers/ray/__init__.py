"""The Ray transport of ``RayBatcher`` (:mod:`.batcher`): the actor that wraps a worker core
(:mod:`.actor`), actor options (:mod:`.options`), weight updates (:mod:`.updates`) and what
crosses the wire (:mod:`.wire`); the Ray session is :mod:`rlstruct.parallel.ray_cluster`'s.

Importing this package imports nothing; ``from rlstruct.batchers import RayBatcher`` says what
to install when Ray is missing."""
