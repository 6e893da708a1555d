"""Device→host transfers: every value a decoder reads back from the device comes through `fetch`,
and every wait for the device before a clock is read through `synchronize`.

On a GPU, reading a tensor's value waits for every kernel queued before it: a host sync. The
decoders keep their decisions on the device and read back as little as they can, once per
round where they can (speculative.py). Counting the reads here lets a test on a CPU, where no sync
can be seen, assert how many a round makes.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch


@dataclass
class Count:
    fetches: int = 0


_COUNT = Count()


def fetch(*tensors: torch.Tensor):
    """The values of `tensors` in one transfer: each as a Python number (0-d) or list.

    Several tensors travel as one float64 block: token ids (< 2**53) and float32 confidences
    are exact in float64, so nothing is lost and the device is waited for once."""
    _COUNT.fetches += 1
    if len(tensors) == 1:
        return tensors[0].tolist()
    # MPS has no float64; there float32 carries ids below 2**24 and float32 values exactly.
    wide = torch.float32 if tensors[0].device.type == "mps" else torch.float64
    block = torch.cat([t.reshape(-1).to(wide) for t in tensors]).cpu()  # the one wait
    values, start = [], 0
    for t in tensors:
        values.append(block[start : start + t.numel()].view(t.shape).to(t.dtype).tolist())
        start += t.numel()
    return values


@contextmanager
def counting() -> Iterator[Count]:
    """Count the fetches made inside the block: `with counting() as count: ...; count.fetches`."""
    before = _COUNT.fetches
    seen = Count()
    try:
        yield seen
    finally:
        seen.fetches = _COUNT.fetches - before


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on `device`: a clock is read only after this."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
