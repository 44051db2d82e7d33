"""The commands of ``rlstruct`` beside ``train``: evaluate a saved policy (:mod:`.evaluate`),
export it to an ONNX or TorchScript file (:mod:`.export`), sweep seeds and trials
(:mod:`.sweep`), tune a batcher layout (:mod:`.tune`)."""
