"""Recording from an engine's continuations file against recording by decoding the target here, side
by side in one process.

A benchmark, not a test. On the reference pair, for each prompt in turn (the order of the three
rotating from prompt to prompt), untimed continuations written first by our decoder:

- before: the record as it was made until records could come from a file: the target decoded
  here, then the draft's rollouts from every position left-padded and recomputed from scratch
  in batches of 64 (the implementation replay/record.py had, kept below as the reference);
- today: `record()` as it is now: the target decoded here, the batched tree rollouts;
- file: the record from a continuations file (the target's tokens read from it, the same
  rollouts), as `sweep --continuations FILE` makes it.

Prints the summed times, before/file and today/file with bootstrap 95 % intervals over prompts,
and checks that the three records hold the same tokens (confidences within 1e-4).

    python -m benchmarks.measurements.record_from_continuations [--task code] [--limit 40] [--max-new-tokens 128]
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from transformers import DynamicCache

from benchmarks.common import parser
from dspark_bench.decoding import confidence
from dspark_bench.decoding.cached_lm import forward_kwargs
from dspark_bench.engines.continuations import write_continuations
from dspark_bench.harness.workload import Workload
from dspark_bench.measure import recording
from dspark_bench.metrics import bootstrap_ratio
from dspark_bench.replay.continuations import open_for

GAMMA = 8


@torch.inference_mode()
def padded_rollouts(draft, sequence, prompt_len, positions, steps, topk, batch=64):
    """The rollouts as replay/record.py computed them before (the reference for `before`)."""
    cache_name, _ = forward_kwargs(draft)
    tokens = np.zeros((positions, steps), dtype=np.int64)
    scores = {m: np.zeros((positions, steps), dtype=np.float32) for m in confidence.SIGNALS}
    for start in range(0, positions, batch):
        rows = [sequence[: prompt_len + j] for j in range(start, min(start + batch, positions))]
        width = max(map(len, rows))
        ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        position_ids = (mask.cumsum(-1) - 1).clamp_min(0)
        cache = {cache_name: DynamicCache(), "use_cache": True}
        for step in range(steps):
            out = draft(input_ids=ids, attention_mask=mask, position_ids=position_ids, **cache)
            probs = torch.softmax(out.logits[:, -1].float(), dim=-1)
            choice = out.logits[:, -1].argmax(dim=-1)
            tokens[start : start + len(rows), step] = choice.numpy()
            for name, values in confidence.all_metrics(probs, topk).items():
                scores[name][start : start + len(rows), step] = values.numpy()
            ids = choice[:, None]
            mask = torch.cat([mask, torch.ones_like(ids)], dim=1)
            position_ids = position_ids[:, -1:] + 1
    return tokens, scores


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def main() -> None:
    args = parser(__doc__, task="code", limit=40, max_new_tokens=128).parse_args()
    folder = Path(tempfile.mkdtemp(prefix="record-bench-"))
    workload = Workload(task=args.task, limit=args.limit, max_new_tokens=args.max_new_tokens, device="cpu")
    path = write_continuations(workload, "ours", folder / "ours.jsonl")
    from dspark_bench.engines.continuations import encoded

    work = encoded(workload)
    pair, prompts, ids = work.pair, work.prompts, work.ids
    vocab = pair.target.get_output_embeddings().weight.shape[0]
    source = open_for(path, prompts, ids, work.max_new_tokens, work.eos_ids, vocab)
    N, eos = work.max_new_tokens, work.eos_ids

    def before(p):
        with patched(recording, "draft_rollouts", padded_rollouts):
            return recording.record(pair, [ids[p]], N, GAMMA, eos_ids=eos)

    def today(p):
        return recording.record(pair, [ids[p]], N, GAMMA, eos_ids=eos)

    def from_file(p):
        return recording.record(pair, [ids[p]], N, GAMMA, eos_ids=eos,
                                continuations=[source.continuation(prompts[p].id)])

    ways = {"before": before, "today": today, "file": from_file}
    today(0)  # warm-up
    seconds = {name: [] for name in ways}
    differing = 0
    for p in range(len(ids)):
        order = list(ways)[p % 3:] + list(ways)[: p % 3]
        made = {}
        for name in order:
            made[name], spent = timed(lambda way=ways[name], p=p: way(p))
            seconds[name].append(spent)
        differing += sum(not same(made["file"], made[name]) for name in ("before", "today"))
    file_s = np.array(seconds["file"])
    print(f"{len(ids)} {args.task} prompts × {N} tokens, rollouts of {GAMMA}, torch threads {torch.get_num_threads()}")
    for name in ("before", "today", "file"):
        print(f"  {name:6s} {sum(seconds[name]):7.1f} s")
    for name in ("before", "today"):
        ratio, low, high = bootstrap_ratio(np.array(seconds[name]), file_s)
        print(f"  {name} / file = {ratio:.2f}× [{low:.2f}, {high:.2f}]")
    print(f"  records differing from the file's: {differing} of {2 * len(ids)} comparisons")


class patched:
    def __init__(self, module, name, value):
        self.module, self.name, self.value = module, name, value

    def __enter__(self):
        self.saved = getattr(self.module, self.name)
        setattr(self.module, self.name, self.value)

    def __exit__(self, *exc):
        setattr(self.module, self.name, self.saved)


def same(a, b) -> bool:
    return (np.array_equal(a.continuation, b.continuation) and np.array_equal(a.rollout, b.rollout)
            and all(np.allclose(a.confidences[m], b.confidences[m], atol=1e-4) for m in confidence.SIGNALS))


if __name__ == "__main__":
    main()
