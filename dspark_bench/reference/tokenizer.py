"""Byte-level BPE tokenizer for the reference pair, saved as a standard HF tokenizer.

Byte-level so every string round-trips exactly: code indentation, tabs and
trailing newlines survive encode/decode, which the benchmark relies on when it
compares generated text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

EOT = "<|endoftext|>"
VOCAB_SIZE = 8192


def train_tokenizer(texts: Iterable[str], vocab_size: int = VOCAB_SIZE):
    """Train a byte-level BPE on `texts` and wrap it as a PreTrainedTokenizerFast."""

    tok = Tokenizer(models.BPE())
    # No prefix space: the first token of a document must not gain a space on decode.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],
        # The full byte alphabet up front, so no input can ever be out of vocabulary.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return wrap(tok)


def wrap(tok: Tokenizer):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOT,
        eos_token=EOT,
        pad_token=EOT,
        unk_token=None,
        # Cleanup would drop spaces before punctuation and break exact round-trips.
        clean_up_tokenization_spaces=False,
    )


def save_tokenizer(tokenizer, path: Path) -> None:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(path))


def load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))
