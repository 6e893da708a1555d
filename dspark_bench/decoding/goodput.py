"""The cost-aware schedule ("goodput"): draft one more token only while that is expected to raise
the round's tokens per second.

After drafting token k with confidence c_k, the fitted acceptance α_k = α(c_k) (acceptance.py)
extends the chance the whole draft survives, P_k = α_1 ⋯ α_k, and the round's expected output,
E_k = 1 + P_1 + … + P_k (accepted tokens plus the target's own). With this machine's step costs
at the run's batch size, drafting k tokens takes k · t_draft + t_verify(k), so the round's
expected rate is E_k / (k · t_draft + t_verify(k)). Guessing that the next token is accepted as
often as this one (confidences run in streaks), drafting k + 1 would give

    (E_k + P_k · α_k) / ((k + 1) · t_draft + t_verify(k + 1)),

and the draft goes on only if that is higher. The token just drafted stays either way: the rule
decides whether to run the next draft forward, so no forward is wasted on a dropped token.
There is no threshold to tune; min_draft_len and gamma_max bound it like every schedule.

The same expressions, in float64, run per token in the decoder (`GoodputRule.continues`) and over
a whole record in replay (`decisions`), so replay and the decoder agree exactly.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from dspark_bench.config import LEARNED
from dspark_bench.decoding.as_numpy import interp, running
from dspark_bench.errors import DsparkError
from dspark_bench.results import write_json


@dataclass(frozen=True)
class Curve:
    """Acceptance probability against confidence: a monotone piecewise-linear function."""

    x: tuple[float, ...]
    y: tuple[float, ...]

    def __call__(self, confidence):
        return np.interp(confidence, self.x, self.y)

    def on_device(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The knots as float64 tensors on `device`, for `interp`."""
        return (torch.tensor(self.x, dtype=torch.float64, device=device),
                torch.tensor(self.y, dtype=torch.float64, device=device))


@dataclass
class AcceptanceFit:
    """One curve per metric, fitted on every drafted token of a record, and its quality."""

    curves: dict[str, Curve]
    quality: dict[str, dict]  # metric -> tokens, brier, ece, raw_brier, raw_ece, mean_acceptance

    def to_dict(self) -> dict:
        return {"curves": {m: {"x": list(c.x), "y": list(c.y)} for m, c in self.curves.items()},
                "quality": self.quality}

    @classmethod
    def from_dict(cls, data: dict) -> "AcceptanceFit":
        curves = {m: Curve(tuple(map(float, c["x"])), tuple(map(float, c["y"]))) for m, c in data["curves"].items()}
        for metric, curve in curves.items():
            if not curve.x or len(curve.x) != len(curve.y) or np.any(np.diff(curve.y) < 0):
                raise DsparkError(f"the acceptance curve of {metric} is not a monotone fit")
        return cls(curves, data.get("quality", {}))

    def save(self, path: Path) -> None:
        write_json(Path(path), self.to_dict())

    @classmethod
    def load(cls, path: Path) -> "AcceptanceFit":
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except (OSError, KeyError, TypeError, ValueError) as err:
            raise DsparkError(f"acceptance fit {str(path)!r} is unreadable: {err}") from None


@dataclass(frozen=True)
class GoodputRule:
    """One metric's curve and the step costs at one batch size."""

    curve: Curve
    t_draft: float
    t_verify: tuple[float, ...]  # index k: a target pass over k drafted tokens + 1

    def continues(self, k, alpha, survival, expected):
        """Whether to draft token k + 1 after token k (numbers or arrays of equal shape)."""
        if k + 1 >= len(self.t_verify):  # no cost for a longer draft: the model was timed up to here
            return np.ones_like(np.asarray(expected), dtype=bool) if np.ndim(expected) else True
        now = expected / (k * self.t_draft + self.t_verify[k])
        then = (expected + survival * alpha) / ((k + 1) * self.t_draft + self.t_verify[k + 1])
        return then > now

    def on_device(self, device: torch.device, gamma_max: int) -> "DeviceGoodput":
        return DeviceGoodput(self, device, gamma_max)


class DeviceGoodput:
    """A GoodputRule's numbers on the device (copied once per decode) and its decisions over a
    whole draft there: the verify-side rule (rules.DeviceRule)."""

    def __init__(self, rule: GoodputRule, device: torch.device, gamma_max: int):
        self.xp, self.fp = rule.curve.on_device(device)
        self.t_draft, self.timed = rule.t_draft, len(rule.t_verify)
        padded = rule.t_verify + (1.0,) * (gamma_max + 2)  # past the timed lengths `continues` says yes
        self.t_verify = torch.tensor(padded, dtype=torch.float64, device=device)
        self.k = torch.arange(1, gamma_max + 1, dtype=torch.float64, device=device)

    def continues(self, confidence: torch.Tensor) -> torch.Tensor:
        """`GoodputRule.continues` after every token of one draft: confidences [n] -> bool [n],
        the decoder's running product and sum taken in the same order, in float64."""
        alpha = interp(confidence.double(), self.xp, self.fp)
        survival = running(alpha, torch.mul)
        expected = running(survival, torch.add, first=1.0)  # ((1 + P_1) + P_2) + ...
        n = len(alpha)
        k = self.k[:n]
        now = expected / (k * self.t_draft + self.t_verify[1 : n + 1])
        then = (expected + survival * alpha) / ((k + 1) * self.t_draft + self.t_verify[2 : n + 2])
        return (then > now) | (k + 1 >= self.timed)


@dataclass
class GoodputModel:
    """What the schedule decides with: acceptance curves per metric, step costs per batch size."""

    acceptance: AcceptanceFit
    costs: dict[int, tuple[float, tuple[float, ...]]]  # B -> (t_draft, t_verify)

    def rule(self, metric: str, batch_size: int) -> GoodputRule:
        nearest = min(self.costs, key=lambda b: (abs(b - batch_size), b))  # costs timed nearest this B
        t_draft, t_verify = self.costs[nearest]
        if metric == LEARNED:  # already a calibrated acceptance probability (learned_signal.py): its own curve
            return GoodputRule(Curve((0.0, 1.0), (0.0, 1.0)), t_draft, t_verify)
        if metric not in self.acceptance.curves:
            raise DsparkError(f"the goodput model has no acceptance curve for the {metric} metric")
        return GoodputRule(self.acceptance.curves[metric], t_draft, t_verify)

    def to_dict(self) -> dict:
        return {"acceptance": self.acceptance.to_dict(),
                "costs": {str(b): {"t_draft": d, "t_verify": list(v)} for b, (d, v) in sorted(self.costs.items())}}

    @classmethod
    def from_dict(cls, data: dict) -> "GoodputModel":
        costs = {int(b): (float(c["t_draft"]), tuple(float(t) for t in c["t_verify"]))
                 for b, c in data["costs"].items()}
        if not costs or any(d <= 0 or len(v) < 2 or min(v) <= 0 for d, v in costs.values()):
            raise DsparkError("the goodput model's step costs are missing or not positive")
        return cls(AcceptanceFit.from_dict(data["acceptance"]), costs)

    @classmethod
    def build(cls, acceptance: AcceptanceFit, surface) -> "GoodputModel":
        """From a record's fit and a cost surface (cost.CostSurface)."""
        # A round's fixed cost (an engine's, cost.CostModel.t_round) goes with its one verify pass.
        return cls(acceptance, {b: (m.t_draft, tuple(m.round_costs())) for b, m in surface.models.items()})


def model_path(path: str | Path) -> Path:
    """A goodput model file, or the sweep folder holding one."""
    path = Path(path)
    return path / "goodput_model.json" if path.is_dir() else path


@functools.lru_cache(maxsize=16)
def load(path: str) -> GoodputModel:
    file = model_path(path)
    if not file.is_file():
        raise DsparkError(f"no goodput model at {str(path)!r} (a replay sweep's folder or its goodput_model.json)")
    try:
        return GoodputModel.from_dict(json.loads(file.read_text()))
    except (OSError, KeyError, TypeError, ValueError) as err:
        raise DsparkError(f"goodput model {str(file)!r} is unreadable: {err}") from None


def rule_for(config) -> GoodputRule:
    """The rule a goodput policy decides with (cached: the decoder asks once per drafted token)."""
    return _rule(config.stopping.goodput_model, config.stopping.metric, config.batching.batch_size)


@functools.lru_cache(maxsize=64)
def _rule(path: str, metric: str, batch_size: int) -> GoodputRule:
    return load(path).rule(metric, batch_size)


def decisions(confidences: np.ndarray, rule: GoodputRule) -> np.ndarray:
    """Replay's view [P, N, G] -> 1.0 where the draft goes on after step k, else 0.0 (the decoder's
    running products and sums, step by step in the same order)."""
    P, N, G = confidences.shape
    out = np.empty((P, N, G))
    survival, expected = np.ones((P, N)), np.ones((P, N))
    for k in range(1, G + 1):
        alpha = rule.curve(confidences[:, :, k - 1].astype(np.float64))
        survival = survival * alpha
        expected = expected + survival
        out[:, :, k - 1] = rule.continues(k, alpha, survival, expected)
    return out
