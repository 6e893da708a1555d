"""The `learned` confidence signal: a calibrated probability that a drafted token is accepted.

A logistic regression fitted on a replay record (replay/learned.py) over what the draft already
computed at that step: every raw signal (confidence.RAW_SIGNALS) and the token's position in the
draft (one-hot; positions past the record's longest draft count as the last). It is read here,
by the engine at every draft step and by replay over a whole record, with one function in
float64 and elementwise arithmetic only (no matmul, whose summation order depends on the
shape), so both see the same numbers and take the same decisions.

Used as `metric: learned` with `signal_model` naming the file (or the replay sweep's folder
holding `learned_signal.json`); every schedule reads it like any metric. Its value is already an
acceptance probability, so the goodput schedule reads it as its own curve.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from dspark_bench.errors import DsparkError

RAW_SIGNALS = ("top1", "entropy", "topk_mass", "margin", "llamacpp_top1")  # confidence.SIGNALS, in this order
FILE = "learned_signal.json"


@dataclass(frozen=True)
class LearnedSignal:
    mean: tuple[float, ...]  # the standardisation of each feature (RAW_SIGNALS, then positions)
    scale: tuple[float, ...]
    coef: tuple[float, ...]
    intercept: float
    positions: int  # one-hot positions 1..positions

    def __call__(self, signals: dict[str, torch.Tensor], step) -> torch.Tensor:
        """Acceptance probability of tokens with these raw `signals` at 0-based draft `step`
        (an int, or a tensor of the signals' shape), in float64."""
        first = signals[RAW_SIGNALS[0]]
        step = torch.as_tensor(step, device=first.device).clamp(max=self.positions - 1)
        z = torch.full(first.shape, self.intercept, dtype=torch.float64, device=first.device)
        for i, name in enumerate(RAW_SIGNALS):
            z = z + self.coef[i] * ((signals[name].double() - self.mean[i]) / self.scale[i])
        for g in range(self.positions):
            i = len(RAW_SIGNALS) + g
            z = z + self.coef[i] * (((step == g).double() - self.mean[i]) / self.scale[i])
        return 1.0 / (1.0 + torch.exp(-z))

    @classmethod
    def from_dict(cls, data: dict) -> "LearnedSignal":
        names = data["features"]
        expected = [*RAW_SIGNALS, *(f"position_{g + 1}" for g in range(len(names) - len(RAW_SIGNALS)))]
        if names != expected or not len(data["mean"]) == len(data["scale"]) == len(data["coef"]) == len(names):
            raise ValueError(f"features {names} are not {expected}")
        if min(data["scale"]) <= 0:
            raise ValueError("a feature's scale is not positive")
        return cls(tuple(map(float, data["mean"])), tuple(map(float, data["scale"])), tuple(map(float, data["coef"])),
                   float(data["intercept"]), len(names) - len(RAW_SIGNALS))


def model_path(path: str | Path) -> Path:
    """A learned signal file, or the replay sweep's folder holding one."""
    path = Path(path)
    return path / FILE if path.is_dir() else path


@functools.lru_cache(maxsize=16)
def load(path: str) -> LearnedSignal:
    file = model_path(path)
    if not file.is_file():
        raise DsparkError(f"no learned signal at {str(path)!r} (a replay sweep's folder or its {FILE})")
    try:
        return LearnedSignal.from_dict(json.loads(file.read_text()))
    except (OSError, KeyError, TypeError, ValueError) as err:
        raise DsparkError(f"learned signal {str(file)!r} is unreadable: {err}") from None
