"""Each engine's step costs side by side: what a verify pass of k drafted tokens, a draft step and
a speculative round cost there, relative to one plain decoding step of that engine
(replay/cost_file.py's cost models)."""

from __future__ import annotations

import numpy as np

from dspark_bench.reporting.plots.base import figure


def verify_curves(models: dict, title: str = ""):
    """Left: t_verify(k) (+ what a round adds: t_round + k · t_round_token; t_round_empty at k = 0) over the
    engine's plain step, k = 0 … its deepest, one line per engine, its draft step as a dotted level;
    right: the same in milliseconds. Where the left curve climbs steeply from k = 0 to 1, verifying even
    one drafted token costs most of a step."""
    fig, axes = figure(11, 4.2, 1, 2)
    relative, absolute = axes[0]
    for i, (label, cost) in enumerate(models.items()):
        color = f"C{i}"
        k = np.arange(len(cost.t_verify))
        verify = np.asarray(cost.round_costs())
        plain = cost.plain_step
        relative.plot(k, verify / plain, "-o", color=color, ms=4,
                      label=f"{label}: verify(k) + round ÷ plain step ({plain * 1e3:.2f} ms)")
        relative.axhline(cost.t_draft / plain, color=color, ls=":", lw=1.5,
                         label=f"{label}: one draft step ÷ plain step ({cost.t_draft / plain:.2f})")
        absolute.plot(k, verify * 1e3, "-o", color=color, ms=4, label=f"{label}: verify(k) + round")
        absolute.axhline(plain * 1e3, color=color, ls="--", lw=1, label=f"{label}: plain step")
    relative.axhline(1.0, color="grey", lw=1)
    relative.set_xlabel("k: drafted tokens verified in one pass (k + 1 positions)")
    relative.set_ylabel("seconds ÷ the engine's plain decoding step")
    absolute.set_xlabel("k: drafted tokens verified in one pass (k + 1 positions)")
    absolute.set_ylabel("milliseconds")
    for ax in (relative, absolute):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title or "step costs of each engine", fontsize=10)
    return fig
