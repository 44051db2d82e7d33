"""Learners: learning in a thread beside collection (:mod:`.thread`), and data-parallel learner
ranks on torch.distributed (:mod:`.group` local processes, :mod:`.torchrun`, :mod:`.ray`), with
what every group shares (:mod:`.base`), what a rank runs (:mod:`.rank`) and the staging of
batch shards onto the ranks' devices (:mod:`.staging`)."""
