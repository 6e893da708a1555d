"""dspark-bench: confidence-scheduled speculative decoding, measured and tuned."""

__version__ = "0.1.0"
