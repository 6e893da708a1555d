"""`dspark-bench continuations`: the target's greedy continuations of a task's prompts, written as a
continuations file (replay/continuations.py) by the engine that serves it, for a sweep or
calibration to record from (`--continuations FILE`) instead of decoding the target here.

- `write_prompts`: the prompts as this tool encodes them (id and token ids, chat template
  applied), for an engine driven elsewhere (vLLM, SGLang on a GPU cluster: the recipes in
  docs/sweeps-and-replay.md#records-from-your-engines-continuations) to continue exactly these.
- `write_continuations(decoder="llamacpp")`: a plain `llama-server` (the target alone, greedy) on
  the target's GGUF file — the user's own, as given, or the pair written as GGUF — one request
  per prompt, the prompt sent as its token ids.
- `write_continuations(decoder="ours")`: our decoder's greedy decoding (the record a sweep makes
  without a file decodes the same).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dspark_bench.config import DecodeConfig
from dspark_bench.decoding.autoregressive import autoregressive_decode
from dspark_bench.engines.llama_server import LlamaServer, build_info, find_server
from dspark_bench.errors import DsparkError
from dspark_bench.harness.gguf import cached_gguf
from dspark_bench.harness.gguf_read import is_gguf
from dspark_bench.harness.models import load_pair
from dspark_bench.harness.runner import stage_steps
from dspark_bench.harness.workload import Workload
from dspark_bench.replay import continuations as files
from dspark_bench.results import check_writable, environment
from dspark_bench.tasks import load_prompts, pair_of
from dspark_bench.tasks.prompts import encode

DECODERS = ("llamacpp", "ours")  # who continues the target: llama.cpp's server, or our decoder


@dataclass
class Encoded:
    """A workload's prompts as this tool encodes them, with the target that continues them."""

    pair: object
    prompts: list
    ids: list[list[int]]
    max_new_tokens: int
    eos_ids: frozenset[int]


def encoded(workload: Workload) -> Encoded:
    workload.check_workload()
    workload.prepare_host()
    prompts, _, task_tokens = load_prompts(workload.task, workload.dataset, workload.split, workload.prompt_field,
                                           workload.category_field, workload.limit)
    # The target alone continues; a draft, when given, is loaded only so that the pair is the sweep's.
    pair = load_pair(workload.target, workload.draft, workload.device, workload.dtype, drafters=("lookup",),
                     pair=pair_of(workload.task))
    ids = [encode(pair.tokenizer, p.text, workload.chat_template) for p in prompts]
    return Encoded(pair, prompts, ids, workload.tokens(task_tokens), workload.runner_settings().eos_ids(pair))


def write_prompts(workload: Workload, out: Path) -> Path:
    """One JSON line per prompt: {"id", "prompt_token_ids"}, what an engine elsewhere is to continue."""
    check_writable(out.parent if out.parent != Path("") else Path("."))
    work = encoded(workload)
    lines = ({"id": prompt.id, "prompt_token_ids": ids} for prompt, ids in zip(work.prompts, work.ids))
    return files.write_lines(out, lines)


def write_continuations(workload: Workload, decoder: str, out: Path, progress=None, say=None,
                        server: str | None = None, gguf_dtype: str = "f32") -> Path:
    """The target's greedy continuation of every prompt by `decoder` (llamacpp | ours), into `out`."""
    if decoder not in DECODERS:
        raise DsparkError(f"--decoder must be one of {', '.join(DECODERS)} (got {decoder!r}); for vLLM or SGLang write "
                          "the prompts (`continuations prompts`) and follow docs/sweeps-and-replay.md")
    if workload.temperature > 0:
        raise DsparkError("a continuations file holds greedy continuations: drop --temperature")
    check_writable(out.parent if out.parent != Path("") else Path("."))
    work = encoded(workload)
    if decoder == "ours":
        return write_ours(work, workload, out, progress)
    return write_llamacpp(work, workload, out, progress, say, server, gguf_dtype)


def write_ours(work: Encoded, workload: Workload, out: Path, progress=None) -> Path:
    config = DecodeConfig.of(max_new_tokens=work.max_new_tokens)
    step = stage_steps(progress, "our decoder: the target's continuations", len(work.ids))

    def lines():
        for prompt, ids in zip(work.prompts, work.ids):
            tokens = autoregressive_decode(work.pair.target, ids, config, work.eos_ids).tokens
            finish = "stop" if tokens and tokens[-1] in work.eos_ids else "length"
            yield files.line(prompt.id, ids, tokens, finish)
            if step:
                step()

    models = work.pair.describe()
    head = files.header({"name": "dspark-bench", "version": environment()["dspark_bench"], "decoder": "ours",
                         "device": models["device"], "dtype": models["dtype"],
                         "target_fingerprint": models["target_fingerprint"]},
                        models["target"], work.max_new_tokens, workload.ignore_eos)
    return files.write(out, head, lines())


def write_llamacpp(work: Encoded, workload: Workload, out: Path, progress=None, say=None, server: str | None = None,
                   gguf_dtype: str = "f32") -> Path:
    binary = find_server(server)
    build = build_info(binary)
    if len(work.eos_ids) > 1:
        raise DsparkError(f"the target stops at {len(work.eos_ids)} EOS ids; a GGUF file names one, so llama.cpp "
                          "would stop elsewhere")
    if is_gguf(str(workload.target or "")):
        target_file = Path(str(workload.target)).expanduser().resolve()  # the user's own file, as given
    else:
        target_file = cached_gguf(work.pair.target, work.pair.tokenizer, work.pair.fingerprints[0], gguf_dtype)
    if say:
        say(f"llama.cpp b{build['build_number']} ({binary}) continues {len(work.ids)} prompts on {target_file.name}")
    context = max(len(ids) for ids in work.ids) + work.max_new_tokens + 8
    step = stage_steps(progress, "llama.cpp: the target's continuations", len(work.ids))
    with LlamaServer(binary, target_file, [], workload.threads, context, None, "llama-server (plain)") as plain:
        def lines():
            for prompt, ids in zip(work.prompts, work.ids):
                answer = plain.complete(ids, work.max_new_tokens, ignore_eos=workload.ignore_eos)
                yield files.line(prompt.id, ids, answer["tokens"], finish_reason(answer, prompt.id))
                if step:
                    step()

        head = files.header({"name": "llama.cpp", "version": f"b{build['build_number']}", "binary": str(binary),
                             "gguf": str(target_file), "threads": workload.threads},
                            target_file.name, work.max_new_tokens, workload.ignore_eos,
                            {"temperature": 0.0, "top_k": 1})
        return files.write(out, head, lines())


def finish_reason(answer: dict, prompt_id: str) -> str:
    """"stop" (its EOS: llama-server's `tokens` include it) or "length"; a continuation the
    server cut short because its context was full is refused here, where the cause is known."""
    if answer.get("truncated"):
        raise DsparkError(f"llama-server stopped prompt {prompt_id!r} after {len(answer['tokens'])} tokens: "
                          "its context is full (llama.cpp caps it at the model's trained length); use fewer "
                          "--max-new-tokens or shorter prompts")
    return "stop" if answer.get("stop_type") == "eos" else "length"
