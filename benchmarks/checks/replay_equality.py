"""Did a change move any result? Two replay sweeps of the same command, made before and after it,
must replay the same policies into the same rounds and predicted speedups.

    bash benchmarks/checks/replay_equality.sh REV     # makes both sweeps (REV and the working tree), then this
    python -m benchmarks.checks.replay_equality BEFORE_SWEEP AFTER_SWEEP

Compared with `DataFrame.equals` on trials.parquet (one row per replayed policy): every knob, the
rounds, drafted/accepted/emitted totals, the metrics and the predicted speedups on the prices the
sweep was given (`--prices FILE`: the same numbers on both sides). Left out, and said: what is
timed on the machine (the predicted speedup on our own prices, and any confirmation's timings)
and the paths of files a sweep writes into its own folder (the goodput and learned-signal models,
whose contents are compared instead).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

TIMED = ["predicted_speedup_ours", "speedup", "speedup_low", "speedup_high", "baseline_tokens_per_s",
         "spec_tokens_per_s", "baseline_mean_new_tokens", "spec_mean_new_tokens", "identical_to_baseline", "source",
         "same_as"]
OWN_PATHS = ["goodput_model", "signal_model"]
FITTED = ["learned_signal.json"]  # fitted on the record alone; goodput_model.json also holds our timed costs


def replayed(folder: Path) -> pd.DataFrame:
    table = pd.read_parquet(folder / "trials.parquet")
    for column in OWN_PATHS:  # the file's own folder differs; whether a policy reads one does not
        table[column] = table[column] != ""
    return table.drop(columns=[c for c in TIMED if c in table]).reset_index(drop=True)


def main(before: Path, after: Path) -> int:
    old, new = replayed(before), replayed(after)
    # A knob added since BEFORE is a new column: the same result only if every policy holds one
    # value in it (the knob at its default); a column gone is a result lost.
    added, gone = [c for c in new if c not in old], [c for c in old if c not in new]
    one_value = all(new[c].nunique(dropna=False) <= 1 for c in added)
    if added or gone:
        print(f"columns added: {', '.join(added) or 'none'} ({'one value each' if one_value else 'VARYING'}); "
              f"columns gone: {', '.join(gone) or 'none'}")
    new = new[[c for c in new if c in old]]
    same = old.equals(new) and one_value and not gone
    print(f"trials.parquet: {len(old)} policies before, {len(new)} after; {new.shape[1]} columns compared "
          f"(left out, timed here: {', '.join(TIMED)}); DataFrame.equals: {old.equals(new)}")
    if not same and old.shape == new.shape:
        differ = [c for c in old if not old[c].equals(new[c])]
        print(f"columns that differ: {', '.join(differ)}")
    for name in FITTED:
        equal = json.loads((before / name).read_text()) == json.loads((after / name).read_text())
        print(f"{name}: {'equal' if equal else 'DIFFERENT'}")
        same = same and equal
    print("EQUAL" if same else "NOT EQUAL")
    return 0 if same else 1


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
