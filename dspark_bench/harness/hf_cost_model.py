"""Predictions priced on the engine that measured them: HF assisted generation's own costs.

`run --decoder hf` times HF's `generate(assistant_model=draft)` against our baseline. Replay
predicts each of its policies round for round (HF's rule, `--semantics hf`); what a round costs
there is HF's, not our decoder's: its `generate` loop, candidate generator and cache cropping cost
more per round than our decoder's. So its cost model (replay/cost_file.py) is:

- t_draft and t_verify(k): the same models' forwards as our decoder runs them (measure/cost_model.py's
  measure_cost: HF's loop calls these very modules);
- t_plain and t_round: fitted on timed runs of fixed γ = 5 and 7 (FIT_GAMMAS), HF assisted
  against our baseline, on prompts set apart for fitting (the source's last FIT_PROMPTS, not decoded by the
  run), as for llama.cpp (engines/llamacpp_prices.py): every prediction is out of sample.

Cached by the models, the library versions, the device and the threads.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

import torch
import transformers

from dspark_bench import schedules
from dspark_bench.config import DecodeConfig
from dspark_bench.errors import DsparkError
from dspark_bench.harness.runner import run, stage_steps
from dspark_bench.measure.cost_model import measure_cost
from dspark_bench.measure.recording import record
from dspark_bench.metrics import summarize
from dspark_bench.replay import cost_file
from dspark_bench.replay.cost import CostSurface
from dspark_bench.replay.simulate import simulate_grid
from dspark_bench.results import write_json
from dspark_bench.tasks import load_prompts
from dspark_bench.tasks.prompts import encode

FIT_GAMMAS = (5, 7)  # the fixed γ an engine's own costs are fitted on (neither among those a comparison usually lists)
FIT_PROMPTS = 5
HF_FIT_VERSION = 2  # in the cache key, so a file fitted the old way is fitted again (2: paired ratios)
FILE = "priced.json"  # a run folder's predictions priced on the measuring engine's costs and on ours


def fit_prompts(workload, prompts) -> list:
    """The prompts an engine's costs are fitted on: the source's last FIT_PROMPTS that the run
    does not decode, so that every prediction it then makes is out of sample."""
    everything, _, _ = load_prompts(workload.task, workload.dataset, workload.split, workload.prompt_field,
                                    workload.category_field, None)
    taken = {p.id for p in prompts}
    spare = [p for p in everything if p.id not in taken][-FIT_PROMPTS:]
    if not spare:
        raise DsparkError(f"an engine's costs are fitted on prompts the run does not decode, and all {len(everything)} "
                          "are in it: run fewer (--limit)")
    return spare


def hf_cache_key(pair, settings, max_new_tokens: int) -> str:
    described = pair.describe()
    key = json.dumps([described["target_fingerprint"], described["draft_fingerprint"], described["dtype"],
                      str(pair.device), transformers.__version__, torch.__version__, torch.get_num_threads(),
                      settings.chat_template, max_new_tokens, HF_FIT_VERSION])
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def hf_prices(pair, spare, settings, max_new_tokens: int, gamma: int, progress=None) -> cost_file.CostFile:
    """HF assisted generation's cost-model file for this pair (module docstring), cached."""
    where = cost_file.cache_home() / f"hf-{hf_cache_key(pair, settings, max_new_tokens)}.json"
    if where.is_file():
        prices = cost_file.load(where)
        if len(prices.surface.at(1).t_verify) > gamma:
            return prices
    gamma = max(gamma, *FIT_GAMMAS)
    ids = [encode(pair.tokenizer, p.text, settings.chat_template) for p in spare]
    policies = [DecodeConfig.of(schedule=schedules.BASELINE, gamma_max=g, min_draft_len=0, semantics="hf",
                                max_new_tokens=max_new_tokens) for g in FIT_GAMMAS]
    fitted = run(pair, spare, policies, dataclasses.replace(settings, repeats=1, decoder="hf"),
                 progress=stage_steps(progress, "HF prices (fit)", len(spare) * len(policies))).samples
    rec = record(pair, ids, max_new_tokens, gamma, eos_ids=settings.eos_ids(pair))
    passes = measure_cost(pair, ids[0] + rec.continuation[0, : int(rec.lengths[0]) // 2].tolist(), gamma)
    order = {p.id: i for i, p in enumerate(spare)}
    runs = [(policy, fitted[fitted["config_id"] == i].sort_values("prompt_id", key=lambda s: s.map(order)).rename(
        columns={"spec_time_s": "spec_s", "baseline_time_s": "baseline_s"})) for i, policy in enumerate(policies)]
    model, per_run = cost_file.fit_overheads(passes, rec, runs)
    described = pair.describe()
    prices = cost_file.CostFile(
        CostSurface({1: model}), {"name": "hf", "version": f"transformers {transformers.__version__}",
                                  "build": {"torch": torch.__version__, "device": str(pair.device)}},
        {key: described[key] for key in ("target", "draft", "target_fingerprint", "draft_fingerprint", "dtype")},
        "t_draft, t_verify(k): the models' forwards timed as our decoder runs them "
        "(measure/cost_model.py measure_cost), which HF's loop calls too; t_plain (our baseline) and t_round: fitted "
        f"on fixed γ={' and '.join(map(str, FIT_GAMMAS))} HF assisted runs against our baseline (fitted_on)",
        cost_file.machine(),  # torch_threads among its keys
        cost_file.now(), {"policies": [p.label() for p in policies], "prompts": [p.id for p in spare], "runs": per_run})
    prices.save(where)
    prices.source = str(where)
    return prices


def priced_hf(planned, folder, settings, progress=None, say=None) -> list[dict]:
    """`run --decoder hf`: each policy's measured speedup beside replay's prediction priced on HF's
    own costs and on our decoder's; into the run folder's priced.json. Returns its rows."""
    pair, configs = planned.pair, planned.configs
    max_new, gamma = configs[0].verification.max_new_tokens, max(c.stopping.gamma_max for c in configs)
    try:
        spare = fit_prompts(planned.config, planned.prompts)
    except DsparkError as why:  # the run itself stands; only its engine-priced predictions are missing
        if say:
            say(f"not priced on HF's own costs: {why}")
        return []
    if say:
        say(f"pricing on HF's own costs: fitted on {len(spare)} other prompts at fixed γ "
            f"{' and '.join(map(str, FIT_GAMMAS))} (cached)")
    prices = hf_prices(pair, spare, settings, max_new, gamma, progress)
    ids = [encode(pair.tokenizer, p.text, settings.chat_template) for p in planned.prompts]
    rec = record(pair, ids, max_new, gamma, eos_ids=settings.eos_ids(pair),
                 progress=stage_steps(progress, "replay record", len(ids)))
    ours = measure_cost(pair, ids[0] + rec.continuation[0, : int(rec.lengths[0]) // 2].tolist(), gamma)
    from dspark_bench.results import read_run  # the run's own samples, as the table shows them

    _, samples = read_run(folder)
    measured = summarize(samples).set_index("config_label")
    rows = []
    for config in configs:
        on_hf = float(simulate_grid(rec, [config], prices.surface.at(1))["predicted_speedup"].iloc[0])
        on_ours = float(simulate_grid(rec, [config], ours)["predicted_speedup"].iloc[0])
        mine = measured.loc[config.label()]
        rows.append({"policy": config.label(), "speedup": float(mine["speedup"]),
                     "speedup_low": float(mine["speedup_low"]), "speedup_high": float(mine["speedup_high"]),
                     "predicted_engine": on_hf, "predicted_ours": on_ours,
                     "error_engine": on_hf / mine["speedup"] - 1, "error_ours": on_ours / mine["speedup"] - 1})
    write_json(folder / FILE, {"engine": prices.label, "prices": prices.source, "fitted_on": {
        k: v for k, v in prices.fitted_on.items() if k in ("policies", "prompts")},
        "ours": ours.to_dict(), "rows": rows})
    return rows
