"""The acceptance fit the goodput schedule decides with, on the shipped pair: per metric, the
Brier score and ECE of the isotonic fit (held out: fitted on half the prompts, scored on the
other) beside the raw confidence's, and the report's calibration figure with the fitted curves.

    python benchmarks/acceptance_fit.py [--task code] [--limit 40] [--max-new-tokens 128] [--out /tmp/acceptance]
"""

from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace


def main() -> None:
    from dspark_bench.harness.models import load_pair
    from dspark_bench.prompts import encode
    from dspark_bench.replay.acceptance import drafted_tokens, fit_tokens
    from dspark_bench.replay.simulate import match_lengths, record
    from dspark_bench.reporting import plots
    from dspark_bench.reporting.calibration import fit_table
    from dspark_bench.tasks import load_prompts

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="code")
    parser.add_argument("--limit", type=int, default=40)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out", type=Path, default=Path("/tmp/acceptance"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    pair = load_pair()
    prompts, _, _ = load_prompts(args.task, None, limit=args.limit)
    ids = [encode(pair.tokenizer, p.text) for p in prompts]
    rec = record(SimpleNamespace(target=pair.target, draft=pair.draft, eos_ids=pair.eos_ids), ids,
                 args.max_new_tokens, 8)
    tokens = drafted_tokens(rec.confidences, match_lengths(rec), rec.lengths)
    fit = fit_tokens(tokens)
    figure = plots.calibration(tokens[["metric", "confidence", "accepted"]], fit=fit,
                               source=f"shipped pair: {len(prompts)} {args.task} prompts × {args.max_new_tokens} tokens")
    figure.savefig(args.out / "calibration.png", dpi=110, bbox_inches="tight")
    print(fit_table(fit))
    print(f"\nfigure: {args.out / 'calibration.png'}")


if __name__ == "__main__":
    main()
