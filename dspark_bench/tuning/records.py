"""A replay sweep's records: one per drafter, cached under a key of everything that changes what
it holds, loaded or recorded. Recorded from the target decoded here, or from the engine's
continuations file (`--continuations`): the file checked against the sweep's prompts before
anything is written, then the drafter's proposals made a prompt at a time into a parts folder
beside the record (measure/record_parts.py: a kill loses one prompt, shards of prompts merge),
assembled into the record once every part is there.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from dspark_bench.config import DecodeConfig, Drafting
from dspark_bench.decoding.confidence import SIGNALS
from dspark_bench.decoding.learned_signal import CONTEXT
from dspark_bench.harness.runner import stage_steps
from dspark_bench.measure import record_parts, sampled_recording
from dspark_bench.measure.recording import record
from dspark_bench.replay import sampled
from dspark_bench.replay.record import Record
from dspark_bench.replay.rounds import check_sampling
from dspark_bench.results import write_folder
from dspark_bench.tasks.prompts import prompts_fingerprint
from dspark_bench.tuning.preparation import LoadedSweep
from dspark_bench.tuning.spec import SweepSpec

if TYPE_CHECKING:
    from dspark_bench.harness.runner import StageProgress


def parts_folder(record_dir: Path) -> Path:
    """Where a record from a continuations file keeps its finished prompts until it is whole."""
    return record_dir.with_name(record_dir.name + ".parts")


def record_from_file(prepared: LoadedSweep, ids: list[list[int]], gamma: int, drafter: Drafting, parts: Path,
                     info: dict, eos_ids: frozenset[int], progress: StageProgress | None, stage: str,
                     shard: tuple[int, int] = (1, 1)) -> Record | None:
    """Record the drafter's proposals on the continuations file's target tokens, a prompt at a
    time into `parts` (what a killed run made is kept); the whole record once every part is
    there (a shard, i/n but 1/1, makes its parts only: the sweep assembles them)."""
    source, base, prompts = prepared.continuations, prepared.base, prepared.prompts
    todo = record_parts.shard_indexes(len(ids), shard)
    kept = sum(record_parts.part_path(parts, p).is_file() for p in todo)
    label = f"{stage} from {source.engine}" + (f" ({kept} of {len(todo)} prompts kept from before)" if kept else "")
    record_parts.record_parts(prepared.pair, drafter, ids, lambda p: source.continuation(prompts[p].id), parts, gamma,
                              base.stopping.topk, shard, stage_steps(progress, label, len(todo)))
    if shard != (1, 1):
        return None
    return record_parts.assemble_parts(parts, ids, base.verification.max_new_tokens, gamma, base.stopping.topk,
                                       eos_ids, drafter, {**info, "continuations": source.describe()})


def drafter_groups(configs: list[DecodeConfig]) -> dict[Drafting, list[int]]:
    """The indexes of the policies each drafter (with its knobs) proposes for: one record each."""
    groups: dict[Drafting, list[int]] = {}
    for i, c in enumerate(configs):
        groups.setdefault(c.drafting, []).append(i)
    return groups


def load_or_record(spec: SweepSpec, prepared: LoadedSweep, gamma: int, ids: list[list[int]], record_dir: Path,
                   progress: StageProgress | None = None, drafter: Drafting | None = None,
                   continuations: list[list[int]] | None = None, shard: tuple[int, int] = (1, 1)):
    """The replay record of these models and prompts (and `drafter`, default the draft model):
    from the cache, else recorded and cached (sampled paths at a temperature > 0); from the engine's
    continuations file where the spec names one (a prompt at a time into a parts folder, resumable:
    record_parts; a `shard` but 1/1 makes its parts only and returns None)."""

    pair, prompts, base = prepared.pair, prepared.prompts, prepared.base
    drafter = drafter or base.drafting
    models = {**pair.describe(), "drafter_fingerprint": pair.drafter_fingerprint(drafter)}
    fingerprint = prompts_fingerprint(prompts)
    stale = False
    if (record_dir / "record.json").is_file():
        rec = sampled.load(record_dir)
        rec.check_matches(models, fingerprint)
        check_sampling(rec.info.get("sampling"), base)  # another temperature or top-p: refused
        if (rec.info.get("sampling")
                or set(SIGNALS) | (set(CONTEXT) if drafter.drafter == "model" else set()) <= set(rec.confidences)):
            return rec
        stale = True  # recorded before a signal records now hold (llama.cpp's own top1, the context features)
    info = {"models": models, "prompts_fingerprint": fingerprint, "prompt_ids": [p.id for p in prompts],
            "categories": [p.category for p in prompts]}
    eos_ids = spec.runner_settings().eos_ids(pair)
    stage = "recording" if drafter.drafter == "model" else f"recording ({drafter.drafter})"
    if not base.greedy:  # K sampled paths per prompt (replay/sampled.py)
        rec = sampled_recording.record_sampled(pair, ids, base, gamma, spec.paths, base.stopping.topk, info,
                                     stage_steps(progress, f"{stage} {spec.paths} sampled paths", len(ids)),
                                     eos_ids, drafter)
    elif prepared.continuations is not None:
        rec = record_from_file(prepared, ids, gamma, drafter, parts_folder(record_dir), info, eos_ids, progress, stage,
                               shard)
        if rec is None:
            return None  # this shard's parts only: the sweep without --shard assembles them
    else:
        rec = record(pair, ids, base.verification.max_new_tokens, gamma, base.stopping.topk, info, eos_ids=eos_ids,
                     progress=stage_steps(progress, stage, len(ids)), drafter=drafter, continuations=continuations)
    try:
        write_folder(record_dir, rec.save, replace=stale)
    except OSError:  # another sweep stored the same record meanwhile: keep theirs
        pass
    shutil.rmtree(parts_folder(record_dir), ignore_errors=True)  # the record holds them now
    return rec


def record_key(spec: SweepSpec, prepared: LoadedSweep, gamma: int, drafter: Drafting | None = None) -> str:
    """A record's cache key: the models (the drafter's), the prompts and every setting that
    changes what it holds."""

    models, base = prepared.pair.describe(), prepared.base
    drafted = prepared.pair.drafter_fingerprint(drafter or base.drafting).replace(":", "-")
    return (f"{models['target_fingerprint']}-{drafted}-{prompts_fingerprint(prepared.prompts)}"
            f"-n{base.verification.max_new_tokens}-g{gamma}-k{base.stopping.topk}-{models['dtype']}"
            + ("-noeos" if spec.ignore_eos else "")
            + ("-notemplate" if spec.chat_template == "none" else "")
            + (f"-c{prepared.continuations.fingerprint}" if prepared.continuations is not None else "")
            # "-r2": the rollouts' own stream (sampled_recording.rollout_seed); a record made before it is made again
            + ("" if base.greedy
               else "-t{temperature:g}-p{top_p:g}-s{seed}-K{paths}-r2".format(**sampled.sampling_of(base, spec.paths))))


def record_all(spec: SweepSpec, prepared: LoadedSweep, gamma: int, ids: list[list[int]], configs: list[DecodeConfig],
               record_dirs: dict, progress: StageProgress | None) -> dict:
    """One record per drafter: the target's continuation is the same, what each proposes is not."""
    records: dict = {}
    for key in drafter_groups(configs):
        known = next(iter(records.values()), None)  # the target's continuations, decoded once
        # (sampled paths are drawn again: the same seeds draw the same paths)
        continuations = None if known is None or prepared.continuations is not None or not prepared.base.greedy else [
            known.continuation[p, : n].tolist() for p, n in enumerate(known.lengths)]
        records[key] = load_or_record(spec, prepared, gamma, ids, record_dirs[key], progress, key,
                                      continuations)
    return records
