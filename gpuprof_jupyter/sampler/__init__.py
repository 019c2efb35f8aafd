from .sampler import Gap, Sampler, Tick

__all__ = ["Gap", "Sampler", "Tick"]
