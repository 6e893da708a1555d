"""The `learned` confidence signal: a calibrated probability that a drafted token is accepted.

A logistic regression fitted on a replay record (replay/learned.py) over what the draft already
computed at that step: every raw signal s (confidence.RAW_SIGNALS) as s, log s and log(1 − s) (so
a linear model can bend each into a logit's shape), and the token's position in the draft
(one-hot; positions past the record's longest draft count as the last). It is read here,
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


FLOOR = 1e-4  # log s and log(1 - s) stay finite at 0 and 1, and do not blow up float32 rounding near them
TRANSFORMS = {  # each raw signal enters as these elementwise functions of it (float64 in, float64 out)
    "": lambda s: s,
    "log_": lambda s: torch.log(s.clamp_min(FLOOR)),
    "log1m_": lambda s: torch.log((1.0 - s).clamp_min(FLOOR)),
}


def feature_names(positions: int) -> list[str]:
    """The features, in the order the fit and the signal both use them."""
    return [f"{prefix}{name}" for name in RAW_SIGNALS for prefix in TRANSFORMS] + \
        [f"position_{g + 1}" for g in range(positions)]


def features(signals: dict[str, torch.Tensor]):
    """Each raw signal's transforms (float64), in feature_names' order; the positions follow them."""
    for name in RAW_SIGNALS:
        value = signals[name].double()
        for transform in TRANSFORMS.values():
            yield transform(value)


@dataclass(frozen=True)
class LearnedSignal:
    mean: tuple[float, ...]  # the standardisation of each feature (feature_names' order)
    scale: tuple[float, ...]
    coef: tuple[float, ...]
    intercept: float
    positions: int  # one-hot positions 1..positions
    topk: int = 5  # the k of the topk_mass it was fitted on (the record's), which the engine must compute
    models: tuple = ()  # (name, fingerprint) of the target and draft it was fitted on, where known

    @functools.cached_property
    def weights(self) -> tuple[float, tuple[float, ...], tuple[float, ...]]:
        """The fit folded for speed: z = constant + Σ slope_i · feature_i + at_position[step]
        (standardising is linear; a one-hot position adds its own weight), so a draft step costs
        two operations a feature instead of three, and one for its position."""
        slopes = tuple(c / s for c, s in zip(self.coef, self.scale))
        constant = self.intercept - sum(a * m for a, m in zip(slopes, self.mean))
        raw = len(self.coef) - self.positions
        return constant, slopes[:raw], slopes[raw:]

    def __call__(self, signals: dict[str, torch.Tensor], step) -> torch.Tensor:
        """Acceptance probability of tokens with these raw `signals` at 0-based draft `step`
        (an int, or an integer tensor of the signals' shape), in float64; the same operations in
        the same order whatever the shape, so engine and replay agree."""
        constant, slopes, at_position = self.weights
        first = signals[RAW_SIGNALS[0]]
        z = torch.full(first.shape, constant, dtype=torch.float64, device=first.device)
        for slope, value in zip(slopes, features(signals)):
            z = z + slope * value
        if isinstance(step, int):
            z = z + at_position[min(step, self.positions - 1)]
        else:
            z = z + position_table(self, first.device)[step.clamp(max=self.positions - 1)]
        return 1.0 / (1.0 + torch.exp(-z))

    @classmethod
    def from_dict(cls, data: dict) -> "LearnedSignal":
        names = data["features"]
        positions = len(names) - len(RAW_SIGNALS) * len(TRANSFORMS)
        expected = feature_names(max(positions, 1))
        if names != expected or not len(data["mean"]) == len(data["scale"]) == len(data["coef"]) == len(names):
            raise ValueError(f"features {names} are not {expected}")
        if min(data["scale"]) <= 0:
            raise ValueError("a feature's scale is not positive")
        return cls(tuple(map(float, data["mean"])), tuple(map(float, data["scale"])), tuple(map(float, data["coef"])),
                   float(data["intercept"]), positions, int(data.get("topk", 5)),
                   tuple(sorted((k, v) for k, v in (data.get("models") or {}).items() if v)))


@functools.lru_cache(maxsize=32)
def position_table(signal: LearnedSignal, device: torch.device) -> torch.Tensor:
    """The per-position weights on `device`, copied there once (not at every draft step)."""
    return torch.tensor(signal.weights[2], dtype=torch.float64, device=device)


def model_path(path: str | Path) -> Path:
    """A learned signal file, or the replay sweep's folder holding one."""
    path = Path(path)
    return path / FILE if path.is_dir() else path


def load(path: str) -> LearnedSignal:
    """The fitted signal at `path` (a file, or a sweep folder holding one), read once per version
    of the file: a file rewritten in place is read again."""
    file = model_path(path)
    if not file.is_file():
        raise DsparkError(f"no learned signal at {str(path)!r} (a replay sweep's folder or its {FILE})")
    stat = file.stat()
    return _load(str(file.resolve()), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=16)
def _load(file: str, mtime_ns: int, size: int) -> LearnedSignal:
    try:
        return LearnedSignal.from_dict(json.loads(Path(file).read_text()))
    except (OSError, KeyError, TypeError, ValueError) as err:
        raise DsparkError(f"learned signal {file!r} is unreadable: {err}") from None
