"""The files an export writes, in each engine's own words, for the version it targets.

`render` turns the chosen policies (one per batch size where the engine takes a table) into
{file name: text}, the engine's own file first; `parse` reads a written file back into our
words, the round trip the tests check beside the engines' own parsers (tests/test_engines.py).
Every format also gets `<format>.md`: the version it targets, the source lines it encodes, its
caveats and the lines that load it. versions.py holds the versions and their sources.
"""

from __future__ import annotations

import json
import shlex

import yaml

from dspark_bench import schedules
from dspark_bench.config import DecodeConfig
from dspark_bench.decoding import controllers
from dspark_bench.decoding.autoregressive import hf_assistant_settings
from dspark_bench.engines.versions import EngineVersion

VLLM_LAST_BATCH = 1 << 16  # the top of the last batch-size range written for vLLM
SGLANG_ADAPTIVE = "sglang_adaptive.json"  # --speculative-adaptive-config, beside sglang_config.yaml
SLOT_KNOBS = tuple(name for name in schedules.named(schedules.SGLANG_ADAPTIVE).reads if name != "candidate_steps")
FILES = {"hf": "assistant_generation_config.json", "vllm": "speculative_config.json", "sglang": "sglang_config.yaml",
         "trtllm": "trtllm_speculative.yaml", "llamacpp": "llama_cpp_flags.txt"}
HF_GENERATE = "generate_kwargs.json"  # the target's generate() settings, beside the assistant's config

NOTES = {
    "hf": "the three assistant keys are read from the ASSISTANT's generation_config (applied to the target they are "
          "silently ignored); HF re-fits assistant_confidence_threshold every round when scikit-learn is installed, "
          "the replayed policy holds it fixed (`run --decoder hf` switches the re-fit off).",
    "llamacpp": "llama.cpp compares --spec-draft-p-min with the top-1 of the draft's 10 most likely tokens, "
                "renormalised over those 10; --semantics llamacpp reads that probability too, so a threshold tuned "
                "under llama.cpp's rule is its p-min. A local draft GGUF needs --spec-type draft-simple (without it "
                "llama-server does not speculate).",
    "vllm": "num_speculative_tokens_per_batch_size (inclusive ranges of batch sizes from 1, each with its length) is "
            "written only for runs with several batch sizes: a batch size between two measured ones takes the smaller "
            "one's length, and one above the largest keeps its length (unlike TensorRT-LLM's table).",
    "sglang": "STANDALONE drafts with a separate small model; topk 1 is a chain, and SGLang sets num-draft-tokens to "
              "num-steps + 1 there (written so). It has one draft length for every batch size. Its adaptive "
              "controller (export --controller: sglang_adaptive.json, a slot per batch size) runs for EAGLE and "
              "EAGLE3 drafts only in 0.5.23 (adaptive_unsupported_reason): with a STANDALONE draft SGLang warns and "
              "keeps --speculative-num-steps, written at the first slot's start.",
    "trtllm": "draft_len_schedule's keys are inclusive upper bounds of the batch size: a batch size between two "
              "measured ones takes the larger one's length, and TensorRT-LLM does not speculate above the largest "
              "key (unlike vLLM's table). Its own controller (export --controller) is one schedule and one acceptance "
              "gate for every batch size: the smallest batch size's tuned one is written.",
}


def llamacpp_flags(policy: DecodeConfig, draft: str, version: EngineVersion) -> list[str]:
    """llama-server's speculative flags for `policy` in `version`'s names (after the target's -m)."""
    fixed = schedules.of(policy).baseline
    p_min = 0.0 if fixed else policy.stopping.threshold
    minimum = 0 if fixed else policy.stopping.min_draft_len  # llama.cpp discards shorter drafts
    if version.name == "legacy":
        return ["--model-draft", draft, "--draft-max", str(policy.stopping.gamma_max), "--draft-min", str(minimum),
                "--draft-p-min", f"{p_min:g}"]
    return ["--spec-type", "draft-simple", "--spec-draft-model", draft,
            "--spec-draft-n-max", str(policy.stopping.gamma_max), "--spec-draft-n-min", str(minimum),
            "--spec-draft-p-min", f"{p_min:g}"]


def trtllm_schedule(lengths: dict[int, int]) -> dict[int, int]:
    """{measured batch size: draft length} as TensorRT-LLM's upper-bound keys: each measured B is
    a key, so sizes between two measured ones take the larger one's length, and the largest
    measured B is the last key (above it TensorRT-LLM does not speculate)."""
    return {b: lengths[b] for b in sorted(lengths)}


def trtllm_lookup(schedule: dict[int, int], batch_size: int) -> int:
    """TensorRT-LLM's rule for a batch size, as tensorrt_llm/_torch/speculative/utils.py
    get_draft_len_for_batch_size has it (decoding/controllers.schedule_length, its controller's)."""
    return controllers.schedule_length(tuple(sorted(schedule.items())), batch_size)


def render(fmt: str, choices: list, models: dict, version: EngineVersion, draft_path: str) -> dict[str, str]:
    """{file name: text} for `fmt`, the engine's file first, then `<fmt>.md`."""
    first = choices[0].exported
    files = {FILES[fmt]: RENDER[fmt](choices, version, draft_path, models)}
    if fmt == "hf":
        files[HF_GENERATE] = json.dumps(hf_generate_kwargs(first), indent=2) + "\n"
    if fmt == "sglang" and adaptive(choices):
        files[SGLANG_ADAPTIVE] = json.dumps(sglang_slots(choices), indent=2) + "\n"
    files[f"{fmt}.md"] = about(fmt, version, choices, models)
    return files


def hf_generate_kwargs(policy: DecodeConfig) -> dict:
    values = {"max_new_tokens": policy.verification.max_new_tokens, "do_sample": not policy.greedy}
    if not policy.greedy:
        values.update(temperature=policy.verification.temperature, top_p=policy.verification.top_p, top_k=0)
    return values


def render_hf(choices, version, draft, models) -> str:
    return json.dumps(hf_assistant_settings(choices[0].exported), indent=2) + "\n"


def render_llamacpp(choices, version, draft, models) -> str:
    target = models.get("target_gguf") or "TARGET.gguf"
    # (getattr: callers may pass choice-like objects without it) plain decoding: no flags
    if getattr(choices[0], "plain", ""):
        return (f"# {version.covers}\n# plain decoding: {choices[0].plain}\n"
                f"# llama-server -m {shlex.quote(target)} $(grep -v '^#' llama_cpp_flags.txt)\n")
    line = shlex.join(llamacpp_flags(choices[0].exported, draft, version))
    return (f"# {version.covers}\n"
            f"# llama-server -m {shlex.quote(target)} $(grep -v '^#' llama_cpp_flags.txt)\n{line}\n")


def render_vllm(choices, version, draft, models) -> str:
    if version.name == "legacy":  # one length for every batch size: batch size 1's
        return json.dumps({"method": "draft_model", "model": draft,
                           "num_speculative_tokens": choices[0].exported.stopping.gamma_max}, indent=2) + "\n"
    lengths = [vllm_length(c.exported, c.batch_size) for c in choices]
    values = {"method": "draft_model", "model": draft,
              "num_speculative_tokens": max(c.exported.stopping.gamma_max for c in choices)}
    if schedules.of(choices[0].exported).controlled:  # its adaptive verification, at each batch size's tuned K
        values["enable_adaptive_verification"] = True
    if len(choices) > 1:  # [[lowest batch size, highest, length], ...] from batch size 1 up
        starts = [1] + [c.batch_size for c in choices[1:]]
        ends = [b - 1 for b in starts[1:]] + [VLLM_LAST_BATCH]
        values["num_speculative_tokens_per_batch_size"] = [[lo, hi, k] for lo, hi, k in zip(starts, ends, lengths)]
    return json.dumps(values, indent=2) + "\n"


def vllm_length(policy: DecodeConfig, batch_size: int) -> int:
    """The draft length vLLM runs `policy` with at `batch_size`: its fixed length, or under its
    controller (vllm-adaptive) the K its table gives there."""
    table = schedules.speculative_tokens_table(policy.stopping.num_speculative_tokens_per_batch_size, check=False)
    return schedules.table_length(table, batch_size, policy.stopping.gamma_max)


def sglang_arguments(policy: DecodeConfig, draft: str) -> dict:
    """SGLang's ServerArgs fields for `policy` (Engine(**these); the YAML has them dashed)."""
    return {"speculative_algorithm": "STANDALONE", "speculative_draft_model_path": draft,
            "speculative_num_steps": policy.stopping.gamma_max, "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": policy.stopping.gamma_max + 1}


def adaptive(choices) -> bool:
    """Every batch size's exported policy is SGLang's adaptive controller (a slot each)."""
    return all(schedules.of(c.exported).controlled for c in choices)


def sglang_slots(choices) -> dict:
    """SGLang's --speculative-adaptive-config: one slot per batch size, each its tuned controller's knobs
    (AdaptiveStepSlot's keys; a batch size is served by the largest slot at or below it)."""
    return {str(c.batch_size): {"candidate_steps": list(controllers.lengths(c.exported)),
                                **{name: getattr(c.exported.stopping, name) for name in SLOT_KNOBS}}
            for c in choices}


def sglang_start(choices) -> int:
    """--speculative-num-steps under --speculative-adaptive: SGLang starts every slot at it where the
    slot has that length, each other slot at its middle (AdaptiveStepSlot); our replay starts each
    slot at its middle. So the first value at which every slot starts at its own middle: the first
    slot's middle, else another slot's length, else a length between or one past them all (slots
    1,2,3,4 and 0,1,3 meet nowhere below 5)."""
    slots = [controllers.lengths(c.exported) for c in choices]
    middles = [lengths[len(lengths) // 2] for lengths in slots]
    top = max(max(lengths) for lengths in slots)
    tried = [middles[0], *sorted({k for lengths in slots for k in lengths}), *range(1, top + 2)]
    return next(v for v in tried if all(v not in lengths or v == middle for lengths, middle in zip(slots, middles)))


def sglang_adaptive_arguments(choices, draft: str) -> dict:
    """SGLang's fields for its adaptive controller: the slots' file, and --speculative-num-steps where
    every slot starts as our replay starts it (`sglang_start`)."""
    start = sglang_start(choices)
    return {**sglang_arguments(choices[0].exported, draft), "speculative_num_steps": start,
            "speculative_num_draft_tokens": start + 1, "speculative_adaptive": True,
            "speculative_adaptive_config": SGLANG_ADAPTIVE}


def render_sglang(choices, version, draft, models) -> str:
    arguments = (sglang_adaptive_arguments(choices, draft) if adaptive(choices)
                 else sglang_arguments(choices[0].exported, draft))
    target = models.get("target", "TARGET")
    kwargs = ", ".join(f"{k}={v!r}" for k, v in arguments.items())
    beside = f"# run it from this folder: --speculative-adaptive-config names {SGLANG_ADAPTIVE}\n" if adaptive(
        choices) else ""
    return (f"# {version.covers}\n{beside}"
            f"# python -m sglang.launch_server --model-path {target} --config sglang_config.yaml\n"
            f"# or, in Python: sglang.Engine(model_path={target!r}, {kwargs})\n"
            + yaml.safe_dump({k.replace("_", "-"): v for k, v in arguments.items()}, sort_keys=False))


def trtllm_controller(policy: DecodeConfig) -> dict:
    """TensorRT-LLM's keys for its own controller (trtllm-schedule): its schedule and gate, as tuned."""
    stopping, values = policy.stopping, {}
    if stopping.draft_len_schedule:
        values["draft_len_schedule"] = dict(schedules.draft_len_schedule(stopping.draft_len_schedule))
    if stopping.acceptance_rate_window_size > 0:
        values.update(acceptance_rate_window_size=stopping.acceptance_rate_window_size,
                      acceptance_rate_threshold=stopping.acceptance_rate_threshold)
    return values


def render_trtllm(choices, version, draft, models) -> str:
    config = {"decoding_type": "DraftTarget" if version.name == "legacy" else "Draft_Target",
              "speculative_model": draft, "max_draft_len": choices[0].exported.stopping.gamma_max}
    head = f"# {version.covers}\n# trtllm-serve TARGET --extra_llm_api_options trtllm_speculative.yaml\n"
    if schedules.of(choices[0].exported).controlled:  # one schedule and gate for every batch size: the first's
        head += (f"# its own controller as tuned at batch size {choices[0].batch_size} "
                 f"({choices[0].exported.policy_label()})\n")
        return head + yaml.safe_dump({"speculative_config": {**config, **trtllm_controller(choices[0].exported)}},
                                     sort_keys=False)
    if len(choices) > 1 and version.name == "legacy":  # lower bounds: each measured B on up
        config["draft_len_schedule"] = {1 if i == 0 else c.batch_size: c.exported.stopping.gamma_max
                                        for i, c in enumerate(choices)}
    elif len(choices) > 1:
        schedule = trtllm_schedule({c.batch_size: c.exported.stopping.gamma_max for c in choices})
        config["draft_len_schedule"] = schedule
        largest = max(schedule)
        head += (f"# draft_len_schedule keys are inclusive upper bounds: a batch size takes the length of the "
                 f"smallest key at or above it; above {largest} (the largest measured) TensorRT-LLM does not "
                 "speculate\n")
    return head + yaml.safe_dump({"speculative_config": config}, sort_keys=False)


RENDER = {"hf": render_hf, "llamacpp": render_llamacpp, "vllm": render_vllm, "sglang": render_sglang,
          "trtllm": render_trtllm}


def about(fmt: str, version: EngineVersion, choices: list, models: dict) -> str:
    """`<fmt>.md`: what the export targets and how to load it."""
    load = {
        "hf": ["draft.generation_config.update(**json.load(open('assistant_generation_config.json')))",
               "out = target.generate(**inputs, assistant_model=draft, **json.load(open('generate_kwargs.json')))"],
        "llamacpp": ["llama-server -m TARGET.gguf $(grep -v '^#' llama_cpp_flags.txt)"],
        "vllm": ["vllm serve TARGET --speculative-config \"$(cat speculative_config.json)\""],
        "sglang": ["python -m sglang.launch_server --model-path TARGET --config sglang_config.yaml"],
        "trtllm": ["trtllm-serve TARGET --extra_llm_api_options trtllm_speculative.yaml"],
    }[fmt]
    policies = "\n".join(f"- B = {c.batch_size}: " + ("plain decoding (no speculative flags)" if getattr(c, "plain", "")
                                                     else c.exported.label()) for c in choices)
    return (f"# {FILES[fmt]}\n\nTargets: {version.covers}.\n\nEncodes: {version.source}.\n\nPolicies:\n{policies}\n\n"
            + "".join(priced_note(c) for c in choices)
            + f"Note: {NOTES[fmt]}\n\nLoad it:\n\n```\n" + "\n".join(load) + "\n```\n")


def priced_note(choice) -> str:
    """What the predictions were priced on, the gain over the engine's defaults, and why plain decoding."""
    if not getattr(choice, "prices", "") or choice.exported_speedup is None:
        return ""
    what = "plain decoding" if choice.plain else f"predicted {choice.exported_speedup:.3f}× over plain decoding"
    text = f"B = {choice.batch_size}: priced on {choice.prices}'s measured costs: {what}"
    if choice.over_defaults is not None:
        text += (f", predicted {choice.over_defaults:.3f}× llama.cpp's own defaults (fixed γ = 3: "
                 "--spec-draft-n-max 3, n-min 0, p-min 0)")
    text += ".\n\n"
    return text + (f"Why plain decoding: {choice.plain}.\n\n" if choice.plain else "")


# --- reading a file back ---------------------------------------------------------------------------


def parse(fmt: str, text: str) -> dict:
    """What a written file says, in our words ({batch size: (gamma_max, threshold, min, semantics)})."""
    if fmt == "hf":
        from transformers import GenerationConfig  # HF's own class reads it, as the assistant would

        gen = GenerationConfig.from_dict(json.loads(text))
        return {1: (gen.num_assistant_tokens, gen.assistant_confidence_threshold, 0, "hf")}
    if fmt == "llamacpp":
        words = shlex.split("\n".join(line for line in text.splitlines() if not line.startswith("#")))
        if not words:  # plain decoding: no policy wins on the engine's prices (export.priced_choice)
            return {1: (0, 0.0, 0, "plain")}
        flags = dict(zip(words[::2], words[1::2]))
        names = ("--spec-draft-n-max", "--spec-draft-p-min", "--spec-draft-n-min") if "--spec-type" in flags else (
            "--draft-max", "--draft-p-min", "--draft-min")
        return {1: (int(flags[names[0]]), float(flags[names[1]]), int(flags[names[2]]), "llamacpp")}
    if fmt == "sglang":
        values = yaml.safe_load(text)
        return {1: (values["speculative-num-steps"], 0.0, 0, "dspark")}
    if fmt == "vllm":
        values = json.loads(text)
        ranges = values.get("num_speculative_tokens_per_batch_size",
                            [[1, VLLM_LAST_BATCH, values["num_speculative_tokens"]]])
        return {int(lo): (min(k, values["num_speculative_tokens"]), 0.0, 0, "dspark") for lo, _, k in ranges}
    config = yaml.safe_load(text)["speculative_config"]  # measured B -> length, under either key meaning
    table = config.get("draft_len_schedule", {1: config["max_draft_len"]})
    return {int(b): (int(g), 0.0, 0, "dspark") for b, g in table.items()}
