"""Cost-model files: what one engine's (or our decoder's) rounds cost, with where the numbers came from.

Replay prices every round on a cost model (cost.py). Whose cost model that is decides what a
prediction is worth: our PyTorch decoder's timings predict our decoder, not llama.cpp or vLLM. A
cost-model file holds one decoder's step costs per batch size and its provenance (who measured
them: an engine, or ours; version, build, machine, the models, how it was measured); a sweep and
`export` price on any such file (`--prices`). The format is documented in
docs/engines-and-export.md#cost-model-files; version 2 (version 1 named "measured_by" "engine",
ours included, and still loads):

    {"format": "dspark-bench cost model", "format_version": 2,
     "measured_by": {"name": "llamacpp", "version": "b11434", "build": {...}},
     "machine": {...}, "models": {"target": ..., "draft": ..., "target_fingerprint": ..., ...},
     "method": "how each number was measured", "measured": "2026-12-03T16:00:00Z",
     "fitted_on": {...},                       # optional: the runs a fitted term came from
     "batch_sizes": {"1": {"t_draft": s, "t_verify": [s, ...], "t_round": s, "t_plain": s,
                           "t_round_empty": s,          # optional: a round whose draft came back empty
                           "context_tokens": n, ...,
                           "by_depth": {"1024": {"t_draft": s, "t_verify": [s, ...]}, ...}}}}
                                                # optional: the passes at other context depths

A file with a wrong shape, a negative, missing or non-finite entry, or for other models is
refused in one line, before anything is priced with it.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dspark_bench.errors import DsparkError
from dspark_bench.replay.cost import CostModel, CostSurface
from dspark_bench.replay.tables import record_depths
from dspark_bench.results import cache_dir, machine, write_json  # machine: what every result names

FORMAT = "dspark-bench cost model"
FORMAT_VERSION = 2
READS = (1, FORMAT_VERSION)  # version 1: "measured_by" was called "engine"
REQUIRED = ("t_draft", "t_verify", "context_tokens")
# Every number a batch size's entry may hold (CostModel's fields), each a non-negative finite number.
SECONDS = ("t_draft", "t_round", "t_round_empty", "t_plain", "t_prefill_target", "t_prefill_draft", "t_heads",
           "t_learned", "t_first_draft", "t_round_token")
# Who measured a cost-model file ("measured_by"'s name): our decoder, or a serving engine.
OURS = "ours"
MEASURERS = {OURS: "our decoder (PyTorch)", "llamacpp": "llama.cpp", "hf": "HF assisted generation",
             "vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}
ENGINES = {name: said for name, said in MEASURERS.items() if name != OURS}
# Files written before the key said who measured them called it "engine", ours included.
OLD_KEY = "engine"


@dataclass
class CostFile:
    """One decoder's cost surface (an engine's, or ours) and where it came from."""

    surface: CostSurface
    measured_by: dict  # name (MEASURERS' keys, or another engine's name), version, build
    models: dict  # target, draft, and their fingerprints where known
    method: str
    machine: dict = field(default_factory=dict)
    measured: str = ""
    fitted_on: dict | None = None
    source: str = ""  # the file it was read from, if any
    timing_health: dict | None = None  # harness.health's verdict on the timings behind it, where judged

    @property
    def label(self) -> str:
        """Whose costs these are, as every prediction names them: "llama.cpp b11434"."""
        name = MEASURERS.get(self.measured_by.get("name", ""), self.measured_by.get("name", "?"))
        version = self.measured_by.get("version")
        return f"{name} {version}" if version else name

    def to_dict(self) -> dict:
        return {"format": FORMAT, "format_version": FORMAT_VERSION, "measured_by": self.measured_by,
                "machine": self.machine,
                "models": self.models, "method": self.method, "measured": self.measured,
                **({"fitted_on": self.fitted_on} if self.fitted_on else {}),
                **({"timing_health": self.timing_health} if self.timing_health else {}), **self.surface.to_dict()}

    def save(self, path: Path) -> Path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        write_json(Path(path), self.to_dict())
        return Path(path)

    def check_models(self, models: dict) -> None:
        """Refuse a cost model measured for other models than `models` (a pair's describe()): by
        fingerprint where the file has them, else by name."""
        for role in ("target", "draft"):
            mine, theirs = self.models.get(f"{role}_fingerprint"), models.get(f"{role}_fingerprint")
            if mine and theirs and mine != theirs:
                raise DsparkError(f"{self.where}was measured for another {role} ({self.models.get(role)}, "
                                  f"fingerprint {mine}), not {models.get(role)} ({theirs}): measure it for this pair")
            if not mine and self.models.get(role) and models.get(role) and self.models[role] != models[role]:
                raise DsparkError(f"{self.where}was measured for {role} {self.models[role]!r}, not {models[role]!r}: "
                                  "measure it for this pair")

    @property
    def where(self) -> str:
        return f"cost model {self.source} " if self.source else "the cost model "


def load(path: str | Path) -> CostFile:
    """A cost-model file, checked (one line for anything wrong with it)."""
    path = Path(path)
    if not path.is_file():
        raise DsparkError(f"cost model {str(path)!r} is not a file")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise DsparkError(f"cost model {path} is not JSON: {error}") from None
    return from_dict(data, str(path))


def from_dict(data, source: str = "") -> CostFile:
    where = f"cost model {source}" if source else "the cost model"
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise DsparkError(f"{where} is not a dspark-bench cost model (its \"format\" is not {FORMAT!r})")
    if data.get("format_version") not in READS:
        raise DsparkError(f"{where} has format_version {data.get('format_version')!r}; this dspark-bench reads "
                          f"{' and '.join(map(str, READS))}")
    if data["format_version"] == 1:  # who measured it was its "engine", ours included
        data = {key: value for key, value in data.items() if key != OLD_KEY} | {"measured_by": data.get(OLD_KEY)}
    for key, kind in (("measured_by", dict), ("models", dict), ("method", str), ("batch_sizes", dict)):
        if not isinstance(data.get(key), kind) or not data[key]:
            raise DsparkError(f"{where} has no {key!r} ({kind.__name__}): every cost model says where it came from")
    if not data["measured_by"].get("name"):
        raise DsparkError(f"{where} names nobody who measured it (\"measured_by\": {{\"name\": ...}})")
    models = {int_key(b, where): check_entry(entry, f"{where}, batch size {b}")
              for b, entry in data["batch_sizes"].items()}
    if len(models) > 1 and any(m.t_round or m.t_round_empty or m.t_plain or m.t_round_token for m in models.values()):
        raise DsparkError(f"{where} has t_round, t_round_token, t_round_empty or t_plain with several batch sizes: "
                          "replay prices those at batch size 1 only; fold them into t_verify and t_draft")
    return CostFile(CostSurface(models), data["measured_by"], data["models"], data["method"], data.get("machine") or {},
                    str(data.get("measured", "")), data.get("fitted_on"), source, data.get("timing_health"))


def int_key(key: str, where: str) -> int:
    try:
        batch_size = int(key)
    except ValueError:
        batch_size = 0
    if batch_size < 1:
        raise DsparkError(f"{where}: batch size {key!r} is not a positive whole number")
    return batch_size


def check_entry(entry, where: str) -> CostModel:
    """One batch size's costs: present, finite, non-negative; at least one verify length past 0."""
    if not isinstance(entry, dict):
        raise DsparkError(f"{where} is not an object of costs")
    missing = [key for key in REQUIRED if key not in entry]
    if missing:
        raise DsparkError(f"{where} lacks {', '.join(missing)}")
    verify = entry["t_verify"]
    if not isinstance(verify, list) or len(verify) < 2:
        raise DsparkError(f"{where}: t_verify must list the seconds of a verify pass for k = 0, 1, ... drafted "
                          "tokens (at least k = 0 and 1)")
    for name, value in [*((f"t_verify[{k}]", v) for k, v in enumerate(verify)),
                        *((key, entry[key]) for key in SECONDS if entry.get(key) is not None)]:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
            raise DsparkError(f"{where}: {name} is {value!r}, not a non-negative number of seconds")
    if any(v <= 0 for v in verify) or entry["t_draft"] <= 0:
        raise DsparkError(f"{where}: t_draft and every t_verify must be more than 0 seconds")
    if not isinstance(entry["context_tokens"], int) or entry["context_tokens"] < 0:
        raise DsparkError(f"{where}: context_tokens is {entry['context_tokens']!r}, not a token count")
    check_depths(entry.get("by_depth", {}), len(verify), where)
    return CostModel.from_dict(entry)


def check_depths(by_depth, lengths: int, where: str) -> None:
    """The depth axis (optional): context tokens -> {"t_draft", "t_verify"} as positive seconds, each
    t_verify as long as the entry's own."""
    if not isinstance(by_depth, dict):
        raise DsparkError(f"{where}: by_depth is not an object of context depths")
    for depth, costs in by_depth.items():
        if not str(depth).isdigit() or int(depth) < 1:
            raise DsparkError(f"{where}: by_depth key {depth!r} is not a context length in tokens")
        if not isinstance(costs, dict) or not isinstance(costs.get("t_verify"), list) or "t_draft" not in costs:
            raise DsparkError(f"{where}: by_depth[{depth}] needs t_draft and a t_verify list")
        if len(costs["t_verify"]) < lengths:
            raise DsparkError(f"{where}: by_depth[{depth}] times {len(costs['t_verify'])} verify lengths, "
                              f"fewer than the entry's {lengths}")
        for value in (costs["t_draft"], *costs["t_verify"]):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) \
                    or value <= 0:
                raise DsparkError(f"{where}: by_depth[{depth}] holds {value!r}, not a positive number of seconds")


def fit_overheads(passes: CostModel, rec, runs, per_token: bool = False) -> tuple[CostModel, list[dict]]:
    """What an engine adds to its passes, from timed runs on the record's prompts: `passes` with
    t_plain, t_round, (`per_token`) t_round_token and (where a run's drafts came back empty)
    t_round_empty filled in, and one row per prompt and policy.

    `runs`: (policy, rows) pairs, rows one per prompt in the record's order with the engine's
    speculative and plain seconds (`spec_s`, `baseline_s`) for its tokens (`new_tokens`,
    `baseline_new_tokens`). Each prompt's passes are priced as replay prices them, at their own
    depths where `passes` has a depth axis (`passes_by_prompt`). t_plain: the passes' one-token
    step at context_tokens plus what the plain side's step takes past its own pass (the median
    over the prompts; without a depth axis, the plain side's median seconds per token). t_round:
    what the speculative run took beyond replay's passes, per round, the speculative run's seconds
    taken as its paired ratio to the plain side times that prompt's plain step priced (what a
    prediction is: a ratio to plain decoding, which a slow stretch under one fit run leaves
    alone): the median over the prompts of the drafting policies, or with `per_token` the line
    through each drafting policy's medians (per round, against tokens drafted per round) whose
    slope is t_round_token (`round_line`). t_round_empty: the same over the runs whose rounds are
    mostly empty drafts (llama.cpp's p-min 1 fit run), per empty round, their few drafting rounds
    charged as the rest. Medians: one prompt timed while the machine hiccupped moves a
    least-squares fit, not the median. Priced at one depth, fit prompts of 900 to 3,500 tokens put
    llama-server's t_round at 2.6 ms where their own depths say 2.4 (docs/depth.md#llamacpp-at-depth)."""
    one_token, spent = passes_by_prompt(passes, rec, runs)
    plain = [[row.baseline_s / row.baseline_new_tokens for row in rows.itertuples()] for _, rows in runs]
    past_pass = statistics.median(p - one_token[i] for per_prompt in plain for i, p in enumerate(per_prompt))
    per_run = []
    for (policy, rows), rounds, plains in zip(runs, spent, plain):
        for p, (row, (n_rounds, empties, drafted, passes_s)) in enumerate(zip(rows.itertuples(), rounds)):
            tokens = int(rec.lengths[p])
            # The speculative side's seconds for replay's tokens at this prompt's priced plain step:
            # its paired ratio to the plain side (the two take turns, so a slow minute slows both)
            # times the step. Absolute seconds would carry each pair's minute of drift into t_round.
            spec_s = row.spec_s / row.new_tokens / plains[p] * (one_token[p] + past_pass) * tokens
            per_run.append({"policy": policy.label(), "prompt_id": row.prompt_id, "tokens": tokens,
                            "rounds": n_rounds, "empty_rounds": empties, "drafted": drafted, "spec_s": spec_s,
                            "passes_s": passes_s, "round_overhead_s": (spec_s - passes_s) / n_rounds,
                            "plain_per_token_s": plains[p]})
    empty, drafting = [], []  # runs of mostly empty drafts (llama.cpp's p-min 1 fit run), the rest
    for r in per_run:
        (empty if 2 * r["empty_rounds"] > r["rounds"] else drafting).append(r)
    t_round, t_round_token = round_line(drafting) if per_token else (
        max(statistics.median(r["round_overhead_s"] for r in drafting), 0.0), 0.0)
    t_round_empty = empty_cost(empty, t_round, t_round_token)
    if per_token and t_round_empty is not None:  # the line again, the drafting runs' few empty rounds at their cost
        t_round, t_round_token = round_line(drafting, t_round_empty)
        t_round_empty = empty_cost(empty, t_round, t_round_token)
    t_plain = passes.at_depths([passes.context_tokens])[1][0, 0] - first_step(passes) + past_pass
    return dataclasses.replace(passes, t_round=t_round, t_round_empty=t_round_empty, t_plain=t_plain,
                               t_round_token=t_round_token), per_run


def empty_cost(empty: list[dict], t_round: float, t_round_token: float) -> float | None:
    """t_round_empty: the median over the mostly-empty runs' rows (fit_overheads') of what each
    empty round took, their few drafting rounds charged t_round + t_round_token a drafted token;
    None without such runs."""
    if not empty:
        return None
    return max(statistics.median(
        (r["spec_s"] - r["passes_s"] - (r["rounds"] - r["empty_rounds"]) * t_round - r["drafted"] * t_round_token)
        / r["empty_rounds"] for r in empty), 0.0)


def round_line(drafting: list[dict], t_round_empty: float = 0.0) -> tuple[float, float]:
    """(t_round, t_round_token): the least-squares line through each drafting policy's median
    overhead per drafting round (its empty rounds, a prompt's last, charged `t_round_empty`)
    against its median tokens drafted per drafting round (fit_overheads' rows), its
    slope floored at 0 (flat: the median overhead, as fit_overheads' flat fit, as where the
    policies draft less than a token apart) and its intercept at 0. It needs policies that draft
    differently: llama.cpp fits on fixed γ 2, 5 and 7 (engines/llamacpp_prices.FIT_GAMMAS); fitted
    on 5 and 7 alone, two tokens apart, the slope was as much the fit prompts' noise as the
    server's."""
    by_policy: dict[str, list[dict]] = {}
    for r in drafting:
        by_policy.setdefault(r["policy"], []).append(r)
    drafting_rounds = lambda r: max(r["rounds"] - r["empty_rounds"], 1)  # noqa: E731
    points = np.array([(statistics.median(r["drafted"] / drafting_rounds(r) for r in rows),
                        statistics.median((r["spec_s"] - r["passes_s"] - r["empty_rounds"] * t_round_empty)
                                          / drafting_rounds(r) for r in rows)) for rows in by_policy.values()])
    if len(points) >= 2 and np.ptp(points[:, 0]) >= 1.0:  # else no slope to read: flat
        slope, intercept = np.polyfit(points[:, 0], points[:, 1], 1)
        if slope > 0:
            return max(float(intercept), 0.0), float(slope)
    return max(float(np.median([r["round_overhead_s"] for r in drafting])), 0.0), 0.0


def passes_by_prompt(passes: CostModel, rec, runs) -> tuple[list[float], list[list[tuple[int, int, int, float]]]]:
    """(each prompt's one-token pass, seconds a token: plain decoding's, each of its tokens at its
    own depth; per run, each prompt's (rounds, empty rounds, tokens drafted, the rounds' passes in
    seconds)): each round's draft steps and verify at the depth it starts at
    (replay/tables.record_depths), flat where `passes` has no depth axis."""
    from dspark_bench.replay.simulate import simulate  # simulate imports this module's cost model

    depths = record_depths(rec)
    one_token = [float(np.mean(passes.at_depths(depths[p, : int(n)])[1][:, 0])) - first_step(passes)
                 for p, n in enumerate(rec.lengths)]
    spent = []
    for policy, _ in runs:
        per_prompt = []
        for p, rounds in enumerate(simulate(rec, policy)):
            starts = np.cumsum([0] + [r.emitted for r in rounds[:-1]])
            draft, costs = passes.at_depths(depths[p, starts])
            seconds = sum(r.draft_forwards * draft[i] + costs[i, r.drafted] - (0.0 if r.draft_forwards else
                                                                                 passes.t_first_draft)
                          for i, r in enumerate(rounds))
            per_prompt.append((len(rounds), sum(r.drafted == 0 for r in rounds), sum(r.drafted for r in rounds),
                               float(seconds)))
        spent.append(per_prompt)
    return one_token, spent


def first_step(passes: CostModel) -> float:
    """What round_costs adds to a round's verify past its pass where nothing is fitted yet: the draft
    model's first-step excess (replay/cost.py)."""
    return passes.round_costs()[0] - passes.t_verify[0]


def plain_seconds_per_token(runs) -> float:
    """The engine's plain decoding, seconds per token: the median over the runs' prompts."""
    return statistics.median(row.baseline_s / row.baseline_new_tokens for _, rows in runs for row in rows.itertuples())


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def ours(surface: CostSurface, pair, method: str = "", capture: str = "eager", *, version: str) -> CostFile:
    """Our decoder's cost model over B (measure/cost_model.py's measure_surface) as a cost-model file;
    `capture`: how its batch-1 passes ran (decoding/capture.py: eager, compiled, cuda-graphs);
    `version`: what ran the passes (measure.cost_model.torch_version: replay imports no torch)."""
    described = pair.describe()
    models = {key: described[key] for key in ("target", "draft", "target_fingerprint", "draft_fingerprint", "dtype")
              if key in described}
    context = surface.at(min(surface.models)).context_tokens  # the cache length its passes were timed at
    build = {"device": str(pair.device), "capture": capture, "context_tokens": context}
    return CostFile(surface, {"name": OURS, "version": version, "build": build},
                    models, method or "interleaved medians of timed forwards with the caches at a realistic "
                    "length (measure/cost_model.py: measure_surface)", machine(), now())


def cache_home() -> Path:
    """Where measured engines' cost models are kept (DSPARK_PRICES_HOME, else ~/.cache/dspark-bench/prices)."""
    return cache_dir("prices", "DSPARK_PRICES_HOME")


def cached(engine: str, models: dict) -> CostFile | None:
    """The newest cached cost model of `engine` measured for these models (a pair's describe()), if any."""
    found = []
    for path in cache_home().glob(f"{engine}-*.json"):
        try:
            costs = load(path)
        except DsparkError:
            continue  # a damaged cache entry is measured again, not trusted
        if all(costs.models.get(key) == models.get(key) for key in ("target_fingerprint", "draft_fingerprint")):
            found.append((costs.measured, str(path), costs))
    return max(found, key=lambda f: f[:2])[2] if found else None


MEASURED = ("llamacpp", "hf")  # the engines whose costs dspark-bench measures and caches itself


def check_choice(choice: str) -> None:
    """`--prices`, read before any model loads or anything is recorded: ours, an engine dspark-bench
    measures (looked up in the cache once the models load: `resolve`), or a cost-model file, whose
    format is checked now. Anything else ends here, in one line with the choices."""
    if choice in ("", OURS, *MEASURED):
        return
    if choice in ENGINES:
        raise DsparkError(f"--prices {choice}: dspark-bench does not measure {ENGINES[choice]}'s costs itself; "
                          "pass its cost-model file (docs/engines-and-export.md#cost-model-files), ours or llamacpp")
    if not Path(choice).exists():
        raise DsparkError(f"--prices {choice!r}: choose ours, llamacpp, hf or a cost-model file's path (there is no "
                          f"file {choice!r})")
    load(choice)


def resolve(choice: str, models: dict) -> CostFile | None:
    """`--prices`: None for "ours" (the sweep times our decoder), a measured engine's cached file
    ("llamacpp"), or a cost-model file's path; checked against the pair's models."""
    if choice in ("", OURS):
        return None
    if choice in ENGINES:
        costs = cached(choice, models)
        if costs is None:
            raise DsparkError(f"no {ENGINES[choice]} cost model for this pair yet: `dspark-bench run --decoder "
                              f"{choice} ...` measures one (cached in {cache_home()}), or pass --prices FILE")
    else:
        costs = load(choice)
    costs.check_models(models)
    return costs
