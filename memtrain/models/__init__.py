"""Models: kind + options + DataSpec -> a model implementing ``protocol.Model`` (see ``registry``)."""

from memtrain.models.registry import MODEL_KINDS, build_model

__all__ = ["MODEL_KINDS", "build_model"]
