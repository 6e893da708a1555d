"""When requests arrive, for replay under load (replay/under_load.py): a Poisson process at a rate, or a
trace file of arrival times. numpy alone: a sweep's spec checks a trace before anything heavy loads."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dspark_bench.errors import DsparkError


@dataclass(frozen=True)
class Arrivals:
    """When each request arrives: seconds from the first (non-decreasing), and what made them."""

    times: np.ndarray
    label: str  # "poisson 2 req/s", "trace arrivals.txt"
    rate: float  # offered requests per second: a Poisson process's own, a trace's mean

    @property
    def requests(self) -> int:
        return len(self.times)


def poisson(rate: float, requests: int, seed: int = 0) -> Arrivals:
    """`requests` arrivals of a Poisson process at `rate` per second, the first at 0."""
    if not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0):
        raise DsparkError(f"an arrival rate must be a number above 0 requests per second (got {rate!r})")
    if requests < 1:
        raise DsparkError(f"a load needs at least 1 request (got {requests})")
    gaps = np.random.default_rng([seed, requests]).exponential(1.0 / rate, requests)
    gaps[0] = 0.0
    return Arrivals(np.cumsum(gaps), f"poisson {rate:g} req/s", float(rate))


def read_trace(path: str | Path) -> Arrivals:
    """A trace file: one arrival time in seconds per line (a first line `arrival_s` and `#`
    comments allowed), non-decreasing; times count from the first."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise DsparkError(f"cannot read the arrival trace {path}: {getattr(err, 'strerror', None) or err}") from None
    times = []
    for number, line in enumerate(lines, 1):
        text = line.split("#")[0].strip().rstrip(",")
        if not text or (number == 1 and text == "arrival_s"):
            continue
        try:
            value = float(text)
        except ValueError:
            raise DsparkError(f"{path}:{number}: an arrival time in seconds, not {text!r}") from None
        if not math.isfinite(value) or value < 0:
            raise DsparkError(f"{path}:{number}: an arrival time must be a finite number >= 0 (got {text})")
        if times and value < times[-1]:
            raise DsparkError(f"{path}:{number}: arrival times must not decrease ({value:g} after {times[-1]:g})")
        times.append(value)
    if not times:
        raise DsparkError(f"the arrival trace {path} holds no arrival time")
    times = np.asarray(times) - times[0]
    rate = (len(times) - 1) / times[-1] if times[-1] > 0 else math.inf
    return Arrivals(times, f"trace {path.name}", float(rate))
