"""The offline reference target/draft pair: trained by this package from text already on disk."""

from dspark_bench.reference.train import build, default_heads_path, default_pair_paths, info

__all__ = ["build", "default_heads_path", "default_pair_paths", "info"]
