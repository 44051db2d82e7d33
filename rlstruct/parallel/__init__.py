"""What the process and Ray plumbing offer to batchers and learners alike: the multiprocessing
context every rlstruct process starts from (:mod:`.context`), how those processes start
(:mod:`.startup`) and how their idle OpenMP threads wait (:mod:`.openmp`), weights in shared
memory (:mod:`.weights`), deadline-bound pipes and CPU-only serialisation (:mod:`.transport`),
and the one module that imports Ray, with the connection its users share (:mod:`.ray`)."""
