"""How well each signal predicts acceptance, held out by prompt: the raw metrics and the learned one.

Quality is held out by prompt (GroupKFold: a prompt's tokens are never both fitted and scored):
ROC AUC, Brier score and expected calibration error of the learned signal (replay/learned.py's
fit, refitted on the training folds) beside each raw metric made a probability the same way the
goodput schedule makes it one (an isotonic fit on the training folds).
"""

from __future__ import annotations

import numpy as np

from dspark_bench.config import LEARNED
from dspark_bench.errors import DsparkError
from dspark_bench.replay.acceptance import brier, ece, fit_curve, roc_auc
from dspark_bench.replay.learned import Tokens, drafted, make_model

FOLDS = 5


def folds(tokens: Tokens):
    """(train, test) index masks, grouped by prompt."""
    from sklearn.model_selection import GroupKFold

    prompts = np.unique(tokens.prompt)
    if len(prompts) < 2:
        raise DsparkError("a held-out evaluation needs at least 2 prompts in the record")
    splitter = GroupKFold(n_splits=min(FOLDS, len(prompts)))
    yield from splitter.split(tokens.features, tokens.accepted, groups=tokens.prompt)


def held_out(tokens: Tokens) -> dict[str, np.ndarray]:
    """Each token's predicted acceptance from a fit that never saw its prompt: the learned signal,
    and each raw metric through its isotonic curve (as the goodput schedule reads it)."""
    out = {name: np.empty(len(tokens.accepted)) for name in (*tokens.raw, LEARNED)}
    for train, test in folds(tokens):
        if len(np.unique(tokens.accepted[train])) < 2:  # a fold of all-accepted tokens: nothing to separate
            out[LEARNED][test] = tokens.accepted[train].mean()
        else:
            model = make_model().fit(tokens.features[train], tokens.accepted[train])
            out[LEARNED][test] = model.predict_proba(tokens.features[test])[:, 1]
        for metric in tokens.raw:
            curve = fit_curve(tokens.raw[metric][train], tokens.accepted[train])
            out[metric][test] = curve(tokens.raw[metric][test])
    return out


def quality(tokens: Tokens, predictions: dict[str, np.ndarray]) -> list[dict]:
    """Per signal: AUC (of the raw value for a raw metric: a monotone fit does not change it much,
    and ties in the fit would), Brier and ECE of its held-out probability."""
    rows = []
    for name, probability in predictions.items():
        ranking = tokens.raw[name] if name in tokens.raw else probability
        rows.append({"signal": name, "tokens": int(len(tokens.accepted)), "auc": roc_auc(ranking, tokens.accepted),
                     "brier": brier(probability, tokens.accepted), "ece": ece(probability, tokens.accepted)})
    return rows


def signal_quality(rec) -> list[dict]:
    """Per signal (every raw metric, then `learned`): held-out AUC, Brier and ECE over the record's
    drafted tokens with a verdict."""
    tokens = drafted(rec)
    if len(np.unique(tokens.accepted)) < 2:
        raise DsparkError("every drafted token of the record was accepted, or none was: no signal to compare")
    return quality(tokens, held_out(tokens))
