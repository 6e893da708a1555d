"""Tensor operations that round exactly as the host does, so a rule decided on the device
(rules.DeviceRule, the goodput rule on the device) agrees with the host's and with replay's
decisions bit for bit: np.interp, and running products and sums taken in the host's order."""

from __future__ import annotations

import torch


def interp(confidence: torch.Tensor, xp: torch.Tensor, fp: torch.Tensor) -> torch.Tensor:
    """`np.interp(confidence, xp, fp)` on float64 tensors, operation for operation, so the
    decoder's device-side rule (rules.DeviceRule) decides exactly as the host and replay do."""
    if len(xp) == 1:
        return fp[0].expand(confidence.shape)
    j = (torch.searchsorted(xp, confidence, right=True) - 1).clamp(0, len(xp) - 2)  # xp[j] <= c < xp[j+1]
    x0, y0 = xp[j], fp[j]
    slope = (fp[j + 1] - y0) / (xp[j + 1] - x0)
    value = torch.where(confidence == x0, y0, slope * (confidence - x0) + y0)
    value = torch.where(confidence >= xp[-1], fp[-1], value)
    return torch.where(confidence < xp[0], fp[0], value)


def running(values: torch.Tensor, op, first: float | None = None) -> torch.Tensor:
    """The running `op` over `values` [n], element by element in order (starting from `first`):
    the host's own loop, so its rounding agrees exactly, where a device scan may associate
    differently. n is at most gamma_max."""
    out, total = [], first
    for value in values.unbind(0):
        total = value if total is None else op(total, value)
        out.append(total)
    return torch.stack(out) if out else values[:0]
