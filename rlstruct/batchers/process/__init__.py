"""The worker-process transport of :class:`~rlstruct.Batcher`: the batcher itself
(:mod:`.batcher`), the worker loop a process serves (:mod:`.worker`) and the processes'
start, watch and stop (:mod:`.processes`)."""
