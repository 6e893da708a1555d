"""Which engine version each export targets, and where in that engine's source its meaning is read.

Every engine's speculative knobs moved within a year (llama.cpp renamed its flags, TensorRT-LLM
turned its schedule's keys from lower into upper bounds), so an export names the version range
it encodes, writes it beside the file, and refuses a version it does not know how to encode
rather than guess. The default is each engine's current release. Each entry cites the source
lines it encodes; the tests check the files against the engines' own code where that code runs
on a CPU (llama.cpp itself, SGLang's parser, HF's GenerationConfig), and pin the rest to these
citations.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dspark_bench import schedules
from dspark_bench.errors import DsparkError


@dataclass(frozen=True)
class EngineVersion:
    engine: str  # the export format
    name: str  # what --engine-version takes
    covers: str  # the version range, in words
    source: str  # where the encoding is read from
    controllers: tuple[str, ...] = ()  # the engine's draft-length controllers it runs as replayed (schedules)


LLAMACPP_CURRENT = EngineVersion(
    "llamacpp", "current",
    "llama.cpp builds b9174 and later (the spec-type names of PR #22964, 2026-05-12; built and run here: b11434)",
    "common/arg.cpp of llama.cpp b11434: --spec-draft-n-max, --spec-draft-n-min, --spec-draft-p-min (alias "
    "--draft-p-min), --spec-draft-model (alias -md/--model-draft), --spec-type draft-simple; --draft-max/--draft-min "
    "removed by PR #22397 (arg_removed); a local draft GGUF needs an explicit --spec-type (common_models_handler_init)")
LLAMACPP_LEGACY = EngineVersion(
    "llamacpp", "legacy",
    "llama.cpp builds up to b7814 (2026-01, before PR #22397 'spec : refactor params')",
    "PR #22397's table: --draft-max/--draft-min became --spec-draft-n-max/--spec-draft-n-min; "
    "the draft model was enabled by -md alone")
# Between the two: the flag rename (PR #22397, late April 2026) without the draft-simple type name
# (PR #22964): neither line above is right there, so those builds are refused.
LLAMACPP_LAST_LEGACY, LLAMACPP_FIRST_CURRENT = 7814, 9174

VERSIONS = {
    "llamacpp": (LLAMACPP_CURRENT, LLAMACPP_LEGACY),
    "sglang": (EngineVersion(
        "sglang", "0.5", "SGLang 0.5.14 and later (checked against 0.5.23, the current release)",
        "sglang/srt/utils/server_args_config_parser.py (ConfigArgumentMerger: a .yaml/.yml file, keys emitted as "
        "--<key> exactly as written, so dashed); sglang/srt/arg_groups/fields/spec.py (speculative_algorithm "
        "STANDALONE, speculative_draft_model_path, speculative_num_steps, speculative_eagle_topk, "
        "speculative_num_draft_tokens); speculative_hook.py rewrites num_draft_tokens to num_steps + 1 at topk 1; "
        "--speculative-adaptive and --speculative-adaptive-config (a JSON of per-batch-size slots) read by "
        "sglang/srt/speculative/adaptive_spec_params.py, whose AdaptiveStepSlot is replayed (0.5.14 to 0.5.23 alike)",
        controllers=(schedules.SGLANG_ADAPTIVE,)),
               EngineVersion(
        "sglang", "0.5-early", "SGLang 0.5.0 to 0.5.13 (no adaptive controller before 0.5.11; another one until "
        "0.5.14)", "as 0.5: the same fixed-length keys; adaptive_spec_params.py's AdaptiveStepSlot differs there")),
    "trtllm": (EngineVersion(
        "trtllm", "current", "TensorRT-LLM after PR #10860 (merged 2026-03; draft_len_schedule keys are upper bounds)",
        "tensorrt_llm/llmapi/llm_args.py (DecodingBaseConfig.draft_len_schedule: 'Batch sizes 1-4: use draft_len=4 ... "
        "33+: use draft_len=0'; validate_draft_len_schedule_and_sort: the smallest key's length == max_draft_len, "
        "every length <= it; DraftTargetDecodingConfig decoding_type 'Draft_Target', speculative_model) and "
        "tensorrt_llm/_torch/speculative/utils.py get_draft_len_for_batch_size (bisect_left, else 0); "
        "acceptance_rate_window_size and acceptance_rate_threshold (PR #12905; pyexecutor/speculation_gate.py "
        "SpeculationGate, py_executor.py _update_batch_acceptance_rate), replayed as trtllm-schedule",
        controllers=(schedules.TRTLLM_SCHEDULE,)),
               EngineVersion(
        "trtllm", "legacy", "TensorRT-LLM before PR #10860 (keys are lower bounds from {1: max_draft_len})",
        "Drafter.get_draft_len_for_batch_size before PR #10860 (bisect_right: the largest key <= the batch size); "
        "decoding_type 'DraftTarget'")),
    "vllm": (EngineVersion(
        "vllm", "current", "vLLM 0.34 and later (read from the 0.34.0 wheel, commit 62d4bc3c7, the current release)",
        "vllm/config/speculative.py (num_speculative_tokens_per_batch_size: inclusive (start, end, k) ranges; "
        "enable_adaptive_verification) and vllm/v1/spec_decode/dynamic/utils.py validate_and_normalize_dynamic_sd_"
        "schedule (sorted, non-overlapping, the first starting at 1; k clamped to num_speculative_tokens; sizes "
        "above the last range keep its k); adaptive verification from vllm/v1/worker/gpu/spec_decode/"
        "adaptive_verification.py and acceptance_estimator.py, replayed as vllm-adaptive (its budget on the step "
        "costs measured here, where vLLM profiles its own at start-up; Model Runner V2, full CUDA graphs)",
        controllers=(schedules.VLLM_ADAPTIVE,)),
             EngineVersion(
        "vllm", "0.24", "vLLM 0.24 to 0.33 (the per-batch-size field; adaptive verification from 0.28, for DSpark "
        "drafts only in 0.28, not written here)",
        "vllm/config/speculative.py of 0.24.0 to 0.33.0 (num_speculative_tokens_per_batch_size, as current)"),
             EngineVersion(
        "vllm", "legacy", "vLLM before 0.24 (no per-batch-size field: one length, batch size 1's)",
        "vllm/config/speculative.py of 0.23.0 (num_speculative_tokens only)")),
    "hf": (EngineVersion(
        "hf", "5", "transformers 5.x (checked against the installed version by a real assisted generate)",
        "transformers/generation/candidate_generator.py (AssistedCandidateGenerator reads num_assistant_tokens, "
        "num_assistant_tokens_schedule and assistant_confidence_threshold from the assistant's generation_config)"),),
}


def version_for(fmt: str, requested: str | None = None) -> EngineVersion:
    """The version profile `fmt` is written for: the default (current) one, or the one `requested` names."""
    profiles = VERSIONS[fmt]
    if requested is None:
        return profiles[0]
    if fmt == "llamacpp":
        return llamacpp_version(requested)
    release = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.(\d+))?\S*", requested.strip())
    if fmt == "vllm" and release:  # the per-batch-size field from 0.24.0, adaptive verification as replayed by 0.34
        minor = (int(release.group(1)), int(release.group(2)))
        return profiles[0] if minor >= (0, 34) else profiles[1] if minor >= (0, 24) else profiles[2]
    if fmt == "sglang" and release and release.group(3) and (int(release.group(1)), int(release.group(2))) == (0, 5):
        return profiles[0] if int(release.group(3)) >= 14 else profiles[1]  # the replayed controller from 0.5.14
    for profile in profiles:  # its name, or a release of its series (sglang "0.5": 0.5.23, 0.5.9, ...)
        if requested == profile.name or (release and requested.startswith(profile.name + ".")):
            return profile
    names = ", ".join(p.name for p in profiles)
    raise DsparkError(f"--engine-version {requested!r}: {fmt} exports are written for {names} "
                      f"({'; '.join(p.covers for p in profiles)})")


def lacks(version: EngineVersion, config) -> list[str]:
    """Why `version` cannot run `config` (a DecodeConfig) as replayed: an engine controller it lacks."""
    name = config.stopping.schedule
    if not schedules.of(config).controlled or name in version.controllers:
        return []
    return [f"the {name} controller as replayed ({version.covers} lacks it)"]


def llamacpp_version(requested: str) -> EngineVersion:
    """llama.cpp's profile for a build ("b11434", "11434") or a name ("current", "legacy")."""
    for profile in VERSIONS["llamacpp"]:
        if requested == profile.name:
            return profile
    match = re.fullmatch(r"b?(\d+)", requested.strip())
    if not match:
        raise DsparkError(f"--engine-version {requested!r}: give a llama.cpp build (b11434), current or legacy")
    build = int(match.group(1))
    if build >= LLAMACPP_FIRST_CURRENT:
        return LLAMACPP_CURRENT
    if build <= LLAMACPP_LAST_LEGACY:
        return LLAMACPP_LEGACY
    raise DsparkError(f"llama.cpp b{build} is between the flag rename (PR #22397) and the draft-simple type "
                      f"(PR #22964), which no export encodes: use b{LLAMACPP_FIRST_CURRENT} or later")
