"""Sampling parameters (torch-free) and the batched sampler (velocity.sampling.sampler)."""
