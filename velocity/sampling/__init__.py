from velocity.sampling.params import SamplingParams

__all__ = ["SamplingParams"]
