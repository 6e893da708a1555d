"""A policy's acceptance profile, for the engines' simulators and synthetic benchmarks
(`dspark-bench profile`; docs/observe.md#acceptance-profiles-out; issue 66).

The engines' simulators draw each decode step's accepted length from a profile someone must
supply; replay holds the exact one of any policy on the user's own prompts. Per round (a decode
step; a round that drafted nothing emits the target's token alone), L its accepted draft tokens:
the marginal rate of position i is P(L ≥ i + 1), the conditional P(L ≥ i + 1 | L ≥ i), the mean
acceptance length 1 + E[L] (the bonus token counted, as every engine reports it). Written as:

- `speculation_profile.json`: NVIDIA ModelOpt's schema 1.0 (examples/specdec_bench/specdec_bench/
  speculation_profile.py: both rate vectors, length K, the step histogram keyed by acceptance
  length, per category, its two validations);
- `vllm_speculative_config.json`: vLLM 0.34's `rejection_sample_method: "synthetic"` with
  `synthetic_acceptance_rates`, the marginal rates (vllm/config/speculative.py: length
  num_speculative_tokens, each in [0, 1], non-increasing);
- `sglang.env`: `SGLANG_SIMULATE_ACC_LEN`, the mean acceptance length, with
  `SGLANG_SIMULATE_ACC_METHOD=match-expected` (sglang/srt/speculative/spec_utils.py: each step
  emits the floor or the ceiling of it, in the proportions that keep its mean; it takes no
  per-position rates);
- `dynamo_args.txt`: Dynamo's mocker flags `--aic-nextn K --aic-nextn-accept-rates c_0,…`, the
  conditional rates (ai-dynamo 1.6.1's help: "entry i is P(draft i accepted | all earlier drafts
  were accepted)"; it samples 1 to 5 draft tokens, so K is at most 5 there).
"""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from dspark_bench import schedules
from dspark_bench.config import KNOBS, LEARNED, DecodeConfig
from dspark_bench.decoding import learned_signal
from dspark_bench.decoding.learned_signal import FILE as LEARNED_FILE
from dspark_bench.engines.run_policies import RunPolicies, run_policies
from dspark_bench.errors import DsparkError
from dspark_bench.harness.calibration_file import profiles_folder
from dspark_bench.knobs import check_needs
from dspark_bench.replay import sampled
from dspark_bench.replay.learned import with_learned
from dspark_bench.replay.simulate import simulate
from dspark_bench.results import write_folder

SCHEMA_VERSION = "1.0"  # ModelOpt's speculation_profile.json
DYNAMO_MAX_NEXTN = 5  # ai-dynamo 1.6.1 --aic-nextn: "Number of MTP draft tokens to sample (1-5)"
CONSISTENCY_TOLERANCE = 0.02  # ModelOpt's mean-consistency check


@dataclass(frozen=True)
class Profile:
    """Accepted lengths of a policy's rounds: `histogram[L]` rounds accepted L draft tokens."""

    width: int  # K: the policy's longest draft
    histogram: dict[int, int]

    @property
    def rounds(self) -> int:
        return sum(self.histogram.values())

    @property
    def marginal(self) -> list[float]:
        """P(L ≥ i + 1), i = 0 .. K − 1."""
        return [sum(n for length, n in self.histogram.items() if length > i) / self.rounds for i in range(self.width)]

    @property
    def conditional(self) -> list[float]:
        """P(L ≥ i + 1 | L ≥ i), i = 0 .. K − 1 (0 past a position no round reached)."""
        survival = [1.0] + self.marginal
        return [after / before if before else 0.0 for before, after in zip(survival, survival[1:])]

    @property
    def mean_accept_length(self) -> float:
        return 1 + sum(length * n for length, n in self.histogram.items()) / self.rounds


def pooled(profiles: list[Profile]) -> Profile:
    """One profile of every round of `profiles` (of one policy: one width)."""
    counts = Counter()
    for profile in profiles:
        counts.update(profile.histogram)
    return Profile(profiles[0].width, dict(sorted(counts.items())))


def profile_of(rounds, width: int) -> Profile:
    """The profile of `rounds` (decoding.types.Round) of a policy drafting at most `width` tokens."""
    counts = Counter(r.accepted for r in rounds)
    if not counts:
        raise DsparkError("the policy replayed no round: no profile")
    return Profile(width, dict(sorted(counts.items())))


def replayed_profiles(rec, policy: DecodeConfig) -> tuple[Profile, dict[str, Profile]]:
    """`policy` replayed on `rec`: its profile over every prompt, and per category where the
    record names each prompt's (a greedy record; a sampled one's rows are paths, not prompts)."""
    per_prompt = simulate(rec, policy)
    width = policy.stopping.gamma_max
    whole = profile_of([r for prompt in per_prompt for r in prompt], width)
    categories = rec.info.get("categories") or []
    by_category: dict[str, list] = {}
    if rec.info.get("sampling") is None and len(categories) == len(per_prompt):
        for category, prompt in zip(categories, per_prompt):
            by_category.setdefault(str(category), []).extend(prompt)
    return whole, {c: profile_of(rounds, width) for c, rounds in sorted(by_category.items()) if rounds}


def modelopt(profile: Profile, policy: DecodeConfig, models: dict, per_category: dict[str, Profile],
             conditions: dict) -> dict:
    """ModelOpt's speculation_profile.json (schema 1.0; module docstring)."""
    marginal, mean = profile.marginal, profile.mean_accept_length
    implied = 1 + sum(marginal)
    return {
        "schema_version": SCHEMA_VERSION, "measured": True, "method": "draft_model",
        "draft_checkpoint": {"path": models.get("draft"), "fingerprint": models.get("draft_fingerprint")},
        "target_model": {"path": models.get("target"), "fingerprint": models.get("target_fingerprint")},
        "num_speculative_tokens": profile.width, "block_size": None, "max_supported_k": profile.width,
        "verification_method": "longest_prefix",
        "conditional_accept_rates": [round(x, 6) for x in profile.conditional],
        "marginal_accept_rates": [round(x, 6) for x in marginal],
        "mean_accept_length": round(mean, 6), "mean_accept_length_per_request": round(mean, 6),
        # a draft model's K-token draft is the prefix of its K+1-token one: the marginals extrapolate to any K ≤ K
        "accept_length_model": "chain_analytic",
        "accept_length_by_k": {str(profile.width): round(mean, 6)},
        "acceptance_length_histogram": {str(length + 1): n for length, n in profile.histogram.items()},
        "per_category": {c: {"mean_accept_length": round(p.mean_accept_length, 6), "rounds": p.rounds,
                             "marginal_accept_rates": [round(x, 6) for x in p.marginal],
                             "conditional_accept_rates": [round(x, 6) for x in p.conditional]}
                         for c, p in per_category.items()} or None,
        "measurement_conditions": {"policy": policy.label(), **conditions},
        "validation": {"mean_consistency": {"implied_mean_accept_length": round(implied, 6),
                                            "reported_mean_accept_length": round(mean, 6),
                                            "abs_delta": round(abs(implied - mean), 6),
                                            "tolerance": CONSISTENCY_TOLERANCE,
                                            "passed": abs(implied - mean) <= CONSISTENCY_TOLERANCE},
                       "marginal_monotonicity": {"passed": all(a >= b for a, b in zip(marginal, marginal[1:])),
                                                 "violations": []}},
    }


def vllm_synthetic(profile: Profile) -> dict:
    """vLLM's --speculative-config keys for synthetic acceptance (merge them into the deployment's)."""
    return {"num_speculative_tokens": profile.width, "rejection_sample_method": "synthetic",
            "synthetic_acceptance_rates": [round(x, 6) for x in profile.marginal]}


def sglang_env(profile: Profile) -> str:
    return (f"SGLANG_SIMULATE_ACC_LEN={profile.mean_accept_length:.6f}\n"
            "SGLANG_SIMULATE_ACC_METHOD=match-expected\n")


def dynamo_args(profile: Profile) -> tuple[str, str]:
    """Dynamo's mocker flags, and a note where K is past what it samples."""
    nextn = min(profile.width, DYNAMO_MAX_NEXTN)
    rates = ",".join(f"{x:.6f}" for x in profile.conditional[:nextn])
    note = (f"# K = {profile.width}: Dynamo's mocker samples at most {DYNAMO_MAX_NEXTN} draft tokens; the first "
            f"{DYNAMO_MAX_NEXTN} positions are written\n" if profile.width > nextn else "")
    return f"--aic-nextn {nextn} --aic-nextn-accept-rates {rates}\n", note


def rendered(profile: Profile, policy: DecodeConfig, models: dict, per_category: dict[str, Profile],
             conditions: dict) -> dict[str, str]:
    """Every file, by name, as its text."""
    args, note = dynamo_args(profile)
    return {"speculation_profile.json": json.dumps(modelopt(profile, policy, models, per_category, conditions),
                                                   indent=2),
            "vllm_speculative_config.json": json.dumps(vllm_synthetic(profile), indent=2),
            "sglang.env": sglang_env(profile), "dynamo_args.txt": note + args}


def chosen_policy(run: RunPolicies, knobs: dict | None = None) -> DecodeConfig:
    """The sweep's best policy at its smallest batch size, each knob given (not None) replacing its
    value; refused in one line where a given knob does nothing for the resulting policy, or where
    it drafts deeper than the record replays. The learned metric reads the sweep's own signal
    where no other is named."""
    best = run.best[min(run.best)][0]
    given = {name: value for name, value in (knobs or {}).items() if value is not None}
    if given.get("metric") == LEARNED and "signal_model" not in given and (run.folder / LEARNED_FILE).is_file():
        given["signal_model"] = str(run.folder / LEARNED_FILE)
    policy = best.replace(**given) if given else best
    check_needs(KNOBS, {name: [value] for name, value in given.items()}, None, [policy])
    if policy.stopping.gamma_max > run.depth:
        raise DsparkError(f"{policy.label()} drafts up to {policy.stopping.gamma_max} tokens; the record of "
                          f"{run.folder.name} replays drafts of at most {run.depth}: sweep with a larger gamma_max")
    return policy


def record_for(run: RunPolicies, policy: DecodeConfig):
    """The sweep's record, with the learned signal `policy` reads where the best's did not bring it."""
    rec = run.rec
    if LEARNED in schedules.round_metrics(policy) and LEARNED not in rec.confidences:
        rec = with_learned(rec, learned_signal.load(policy.stopping.signal_model))
    return rec


def profile_folder(folder: Path, policy: DecodeConfig, best: DecodeConfig) -> Path:
    """Where a profile goes by default: FOLDER/profiles for the best policy, FOLDER/profiles-<policy>
    for another (its label, in the characters a folder name keeps)."""
    if policy == best:
        return Path(folder) / "profiles"
    return Path(folder) / ("profiles-" + "-".join(re.findall(r"[A-Za-z0-9.]+", policy.label().replace("γ", "g"))))


def conditions_of(rec, source, whole: Profile) -> dict:
    """How a profile was measured: where, on how many prompts and rounds, at which length and temperature."""
    return {"source": str(source), "prompts": len(rec.lengths), "rounds": whole.rounds,
            "max_new_tokens": rec.max_new_tokens,
            "temperature": (rec.info.get("sampling") or {}).get("temperature", 0.0)}


def write_profiles(folder: Path, out: Path | None = None, knobs: dict | None = None
                   ) -> tuple[Path, Profile, DecodeConfig]:
    """`dspark-bench profile`: the profile of `folder`'s best policy (at its smallest batch size), or
    of the policy `knobs` make of it (`chosen_policy`), replayed on its record, every format written
    into `out` (default: `profile_folder`), whole or not at all; an existing folder is never
    overwritten."""
    run = run_policies(Path(folder))
    if run.record is None:
        at_temperature = float((run.info.get("config") or {}).get("temperature") or 0.0) > 0
        raise DsparkError(f"{folder} keeps no replay record to profile from" + (
            ": a sampled run keeps no paths of the target; sweep it (`dspark-bench sweep --temperature T --paths K`)"
            if at_temperature else ": give a replay sweep's folder"))
    policy = chosen_policy(run, knobs)
    target = Path(out) if out is not None else profile_folder(folder, policy, run.best[min(run.best)][0])
    if target.exists():  # before any replay
        raise DsparkError(f"{target} already exists; profiles are never overwritten (give --out)")
    rec = record_for(run, policy)
    whole, per_category = replayed_profiles(rec, policy)
    files = rendered(whole, policy, run.info.get("models") or {}, per_category, conditions_of(rec, folder, whole))
    return write_tree(target, {"": files}), whole, policy


# --- per domain, from a calibration (`dspark-bench calibrate`) ------------------------------------


def folder_names(domains) -> dict[str, str]:
    """Each domain's folder name: its name in the characters a folder name keeps, made distinct
    where two domains would share one ("a/b" and "a b")."""
    names: dict[str, str] = {}
    for domain in domains:
        base = "-".join(re.findall(r"[A-Za-z0-9._]+", str(domain))).strip(".") or "domain"
        name, n = base, 1
        while name.lower() in {taken.lower() for taken in names.values()}:
            n += 1
            name = f"{base}-{n}"
        names[domain] = name
    return names


def calibration_profiles(records: dict, chosen: dict[str, DecodeConfig], global_policy: DecodeConfig,
                         models: dict, source) -> dict[str, dict[str, str]]:
    """A calibration's profiles, by sub-folder: `global` (the global policy over every domain's
    record, each domain a category) and `domains/<name>` (each domain's own policy on its own
    record); a sampled record's every path, at its temperature."""
    records = {domain: sampled.as_one(rec) for domain, rec in records.items()}
    width = global_policy.stopping.gamma_max
    per_domain = {domain: profile_of([r for prompt in simulate(rec, global_policy) for r in prompt], width)
                  for domain, rec in records.items()}
    whole = pooled(list(per_domain.values()))
    first = next(iter(records.values()))
    conditions = {**conditions_of(first, source, whole), "prompts": sum(len(r.lengths) for r in records.values())}
    trees = {"global": rendered(whole, global_policy, models, per_domain, conditions)}
    names = folder_names(records)
    for domain, name in names.items():
        own, _ = replayed_profiles(records[domain], chosen[domain])
        trees[f"domains/{name}"] = rendered(own, chosen[domain], models, {},
                                            {**conditions_of(records[domain], source, own), "domain": domain})
    trees[""] = {"domains.json": json.dumps({domain: f"domains/{name}" for domain, name in names.items()}, indent=1)}
    return trees


def write_tree(target: Path, trees: dict[str, dict[str, str]], replace: bool = False) -> Path:
    """Every sub-folder's files into `target`, whole or not at all (`replace`: an existing one swapped out)."""

    def fill(partial: Path) -> None:
        for folder, files in trees.items():
            (partial / folder).mkdir(parents=True, exist_ok=True)
            for name, text in files.items():
                (partial / folder / name).write_text(text)

    try:
        return write_folder(target, fill, replace)
    except FileExistsError:
        raise DsparkError(f"{target} already exists; profiles are never overwritten (give --out)") from None


def write_calibration_profiles(out: Path, records: dict | None, best, models: dict,
                               force: bool) -> tuple[Path | None, str | None]:
    """A replay calibration's profiles (`calibration_profiles`: `best(domain)` each domain's policy,
    `best()` the global one, the smallest batch size's) into `<file stem>-profiles/` beside `out`,
    written before the file that names them. (None, why) where there are none: a real calibration
    keeps no record (a stale folder goes under `force`), or replay cannot profile a chosen policy,
    which costs the profiles, never the calibration."""
    target = profiles_folder(out)
    if records is None:
        if force and target.is_dir():
            shutil.rmtree(target)
        return None, None
    try:
        trees = calibration_profiles(records, {domain: best(domain) for domain in records}, best(), models, out)
        return write_tree(target, trees, replace=force), None
    except DsparkError as error:
        return None, f"no acceptance profiles: {error}"
