"""Prompt lookup (n-gram matching): propose what followed the context's last n-gram before.

The drafter HF calls `prompt_lookup_num_tokens`, vLLM `ngram` and llama.cpp its ngram types,
with a confidence the scheduler can use. The last n tokens of the sequence (prompt and output
so far), for the longest n from ngram_max down to ngram_min that occurred earlier, are looked up
in the sequence; every earlier occurrence votes for the token that followed it. The draft takes
the most voted token (ties: the latest occurrence's), keeps the occurrences that agreed, and
goes on while any is left, up to the round's limit; an occurrence may run on into the tokens
drafted this round, so a repeating pattern is drafted on.

Its confidence is a distribution over the vocabulary built from the votes: with c(x) votes
for x out of c in all, after a match of m tokens (the n-gram and the tokens drafted since),
    q(x) = c(x) / (c + 1/m),   the rest, (1/m) / (c + 1/m), spread over the unvoted tokens,
so it rises with the share of occurrences that continued the same way and with the match's
length: one occurrence of a 1-gram gives top-1 0.5, of a 3-gram 0.75; four agreeing 3-gram
occurrences 0.92. Every confidence metric (top1, margin, entropy, top-k mass, gini) reads it.
The drafter itself is deterministic: sampling verifies its token as drawn from a point mass
(q = one-hot), which the rejection rule keeps lossless (accept x with probability p(x), else
draw from p without x).
"""

from __future__ import annotations

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view

from dspark_bench.decoding import confidence


def continuation(seq, ngram_min: int, ngram_max: int, limit: int) -> tuple[list[int], list[tuple]]:
    """The lookup draft of at most `limit` tokens after `seq`, and per token its votes
    (tokens voted for, their counts, the match length)."""
    arr = np.asarray(seq, dtype=np.int64)
    T = len(arr)
    starts, n = np.zeros(0, dtype=np.int64), 0
    for n in range(min(ngram_max, T - 1), ngram_min - 1, -1):
        # Windows that end before the last token, so each has a continuation in `seq`.
        windows = sliding_window_view(arr[: T - 1], n)
        starts = np.flatnonzero((windows == arr[T - n :]).all(axis=1))
        if len(starts):
            break
    tokens, votes = [], []
    alive = starts + n  # where each occurrence's continuation is
    # An occurrence may run on into the tokens drafted this round (a repeating pattern goes on).
    ext = np.concatenate([arr, np.zeros(limit, dtype=np.int64)])
    while len(tokens) < limit and len(alive):
        values, counts = np.unique(ext[alive], return_counts=True)
        winners = values[counts == counts.max()]
        latest = ext[alive[::-1]]  # the latest occurrence's vote breaks a tie
        token = int(winners[0]) if len(winners) == 1 else int(latest[np.isin(latest, winners)][0])
        votes.append((values, counts, n + len(tokens)))
        ext[T + len(tokens)] = token
        tokens.append(token)
        alive = alive[ext[alive] == token] + 1
        alive = alive[alive < T + len(tokens)]
    return tokens, votes


def vote_distribution(values: np.ndarray, counts: np.ndarray, match: int, vocab: int) -> torch.Tensor:
    """q over the vocabulary from an occurrence vote (see the module's docstring) [vocab]."""
    rest = 1.0 / match
    total = counts.sum() + rest
    q = torch.full((vocab,), rest / total / max(vocab - len(values), 1), dtype=torch.float32)
    q[torch.from_numpy(values)] = torch.from_numpy(counts / total).float()
    return q


def scores(votes: list[tuple], vocab: int, topk: int) -> dict[str, torch.Tensor]:
    """Every confidence metric of each drafted token [n] (the record keeps them all)."""
    if not votes:
        return {name: torch.zeros(0) for name in confidence.SIGNALS}
    q = torch.stack([vote_distribution(values, counts, match, vocab) for values, counts, match in votes])
    return confidence.all_metrics(q, topk)
