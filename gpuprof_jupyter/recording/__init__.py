from .recorder import Recorder

__all__ = ["Recorder"]
