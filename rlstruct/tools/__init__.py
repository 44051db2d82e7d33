"""The commands of ``rlstruct`` beside ``train``: evaluate a saved policy (:mod:`.evaluate`),
sweep seeds and trials (:mod:`.sweep`), tune a batcher layout (:mod:`.tune`)."""
