"""Pure GRPO math: group advantages, position-exact training layout, token log-probs and the loss.

No Kafka and no services here: everything is a function of plain data and tensors, so it is tested
by hand-computed examples and against TRL 1.16's GRPOTrainer. Import from the modules: `advantages`
is plain Python that the sampler uses without loading torch; the others need torch.
"""
