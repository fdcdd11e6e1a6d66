"""Pure GRPO math: group advantages, position-exact training layout, token log-probs and the loss.

No Kafka and no services here: everything is a function of plain data and tensors, so it is tested
by hand-computed examples and against TRL 1.16's GRPOTrainer. Import from the modules: `advantages`
(used by the sampler) and `config` (the loss's parameters, declared by the trainer's settings) are plain
Python that never loads torch; the others need torch.
"""
