"""The offline reference target/draft pair: trained by this package from text already on disk.

The corpora, read only from the local install (`corpus`), the shapes and settings every build
stage shares (`setup`), the training sample, held-out text and token arrays (`data`), the
byte-level BPE tokenizer (`tokenizer`), training target and draft (`train`), and the evaluation
and export of what ships (`export`); and the long-context pair, the shipped pair trained on at
4,096 tokens, with its loss by depth (`long`).
"""

from dspark_bench.reference.train import build, default_heads_path, default_pair_paths, info

__all__ = ["build", "default_heads_path", "default_pair_paths", "info"]
