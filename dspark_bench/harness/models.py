"""Load a target/draft pair from Hugging Face names or local paths.

Users' models load exactly as they would online (`from_pretrained(name_or_path)`); without
`--target/--draft` the project's own offline reference pair is used: the 256-token one, or the
long-context one (reference/long.py) for the tasks built for it (tasks.pair_of).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from dspark_bench.decoding import heads
from dspark_bench.depth import DEPTH_EDGES, DEPTH_LABELS, depth_entries
from dspark_bench.errors import DsparkError, first_line
from dspark_bench.harness.gguf_read import hf_folder, is_gguf
from dspark_bench.reference import default_heads_path, default_pair_paths
from dspark_bench.reference.long import long_pair_paths
from dspark_bench.tasks.hub import hub_reachable

DEVICES = ("auto", "cpu", "cuda", "mps")
NO_DRAFT = ("the model drafter needs a draft model: pass --draft (sharing the target's vocabulary), "
            "or draft without one (--drafter lookup, or --drafter heads with --heads)")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class ModelPair:
    target: torch.nn.Module
    draft: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    target_name: str
    draft_name: str
    device: torch.device
    dtype: torch.dtype
    heads_path: str | None = None  # the target's multi-token heads (default: the shipped ones, for the shipped target)
    files: dict = dataclasses.field(default_factory=dict)  # the SHA-256 of each model loaded from a GGUF file

    @functools.cached_property
    def heads(self):
        """The target's heads (heads.py), loaded on first use by the heads drafter."""

        path = self.heads_path
        if path is None:
            if Path(self.target_name).resolve() != Path(default_pair()[0]).resolve():
                raise DsparkError("the heads drafter needs heads trained on this target: pass --heads with a folder "
                                  "from `dspark-bench models build --heads` (only the shipped target has heads "
                                  "built in)")
            path = default_heads_path()
        return heads.load(path, self.target)

    def drafter_for(self, config) -> object:
        """What `config.drafting.drafter` drafts with (engine.speculative_decode's `draft`)."""
        return {"model": lambda: self.draft, "heads": lambda: self.heads,
                "lookup": lambda: None}[config.drafting.drafter]()

    def drafter_fingerprint(self, drafting) -> str:
        """Identifies what drafts (a config.Drafting): the draft model, the heads' weights, or
        lookup and its knobs."""
        if drafting.drafter == "model":
            return self.fingerprints[1]
        if drafting.drafter == "heads":
            return "heads:" + model_fingerprint(self.heads, with_config=False)
        return f"lookup:{drafting.ngram_min}-{drafting.ngram_max}"

    @property
    def eos_ids(self) -> frozenset[int]:
        eos = self.target.generation_config.eos_token_id if self.target.generation_config else None
        eos = eos if eos is not None else self.tokenizer.eos_token_id
        if eos is None:
            return frozenset()
        return frozenset(eos if isinstance(eos, list) else [eos])

    @functools.cached_property
    def fingerprints(self) -> tuple[str, str | None]:
        # A pass over every weight: once per loaded pair (the weights do not change after loading).
        return model_fingerprint(self.target), model_fingerprint(self.draft) if self.draft is not None else None

    def describe(self) -> dict:
        return {
            "target": self.target_name,
            "draft": self.draft_name,
            "target_fingerprint": self.fingerprints[0],
            "draft_fingerprint": self.fingerprints[1],
            "target_params": sum(p.numel() for p in self.target.parameters()),
            "draft_params": sum(p.numel() for p in self.draft.parameters()) if self.draft is not None else 0,
            **self.files,
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            # The heads drafter's heads, where a run used them (loaded on first use).
            **({"heads": self.heads_path or "shipped", "heads_fingerprint": model_fingerprint(self.heads, False)}
               if "heads" in self.__dict__ else {}),
        }


def resolve_device(device: str) -> torch.device:
    if device not in DEVICES:
        raise DsparkError(f"unknown device {device!r}; choose one of {', '.join(DEVICES)}")
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise DsparkError("--device cuda was asked for but no CUDA device is available")
    if device == "mps" and not torch.backends.mps.is_available():
        raise DsparkError("--device mps was asked for but MPS is not available")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        # fp32 on CPU (bf16 matmuls are slow there); bf16 on CUDA; fp16 on Apple silicon.
        return {"cuda": torch.bfloat16, "mps": torch.float16}.get(device.type, torch.float32)
    if dtype not in DTYPES:
        raise DsparkError(f"unknown dtype {dtype!r}; choose one of auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


def default_pair(which: str = "short") -> tuple[str, str]:
    """Paths of a shipped reference pair: the 256-token one ("short") or the long-context one
    ("long"; one line saying how to build it where it is not built)."""

    if which == "long":
        target, draft = long_pair_paths()
        if not all((folder / "config.json").is_file() for folder in (target, draft)):
            raise DsparkError(f"the long-context reference pair is not built ({target.parent} holds no target "
                              "and draft): run `dspark-bench models build --long`, or name models with "
                              "--target / --draft")
        return str(target), str(draft)
    target, draft = default_pair_paths()
    return str(target), str(draft)


def _in_hub_cache(name: str) -> bool:
    """Whether a hub model was downloaded before (then it loads offline)."""
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(name, "config.json"), str)


def _load_model(name: str, role: str, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    try:
        model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype)
    except (OSError, ValueError, EnvironmentError) as err:
        reason = first_line(err)
        raise DsparkError(f"cannot load the {role} model {name!r}: {reason}") from None
    return model.to(device).eval()


def load_tokenizer(name: str) -> PreTrainedTokenizerBase:
    try:
        return AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as err:
        reason = first_line(err)
        raise DsparkError(f"cannot load a tokenizer from {name!r}: {reason}") from None


def load_pair(
    target: str | None = None, draft: str | None = None, device: str = "auto", dtype: str = "auto",
    heads: str | None = None, drafters=("model",), pair: str = "short",
) -> ModelPair:
    """Load both models (and the target's tokenizer), refusing pairs that cannot work together.

    A target alone (no draft) serves the drafters that need no second model (heads, lookup):
    `drafters` names the policies' drafters, and one of them being the model drafter (as by
    default) refuses it before anything loads. A `.gguf` file loads through its cached HF conversion (gguf_read).
    Naming neither model loads the shipped reference pair `pair` names ("short" or "long": tasks.pair_of)."""
    if target is None and draft is None:
        target, draft = default_pair(pair)
    elif target is None:
        raise DsparkError("--draft needs a --target: pass both, or neither to use the reference pair")
    elif draft is None and "model" in drafters:
        raise DsparkError(NO_DRAFT)
    roles = [(target, "target")] + ([(draft, "draft")] if draft is not None else [])
    for name, role in roles:
        check_reachable(name, role)
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    folders = {role: model_folder(name, role) for name, role in roles}
    target_model = _load_model(folders["target"][0], "target", torch_device, torch_dtype)
    draft_model = _load_model(folders["draft"][0], "draft", torch_device, torch_dtype) if draft is not None else None
    tokenizer = load_tokenizer(folders["target"][0])
    if draft_model is not None:
        share_vocabulary(target_model, draft_model, tokenizer, lambda: load_tokenizer(folders["draft"][0]))
    files = {f"{role}_gguf_sha256": sha for role, (_, sha) in folders.items() if sha is not None}
    return ModelPair(target_model, draft_model, tokenizer, target, draft, torch_device, torch_dtype, heads, files)


def check_reachable(name: str, role: str) -> None:
    """A local path that exists, or a hub id that is cached or can be downloaded."""
    if Path(name).expanduser().exists():
        return
    # Hub ids are "name" or "org/name" (dots allowed: Qwen/Qwen2.5-7B); anything else is a path.
    if name.startswith((".", "/", "~")) or name.count("/") > 1 or is_gguf(name):
        raise DsparkError(f"{role} model path {name!r} does not exist")
    if not _in_hub_cache(name) and not hub_reachable():
        raise DsparkError(f"{role} model {name!r} is not a local folder and the hub cannot be reached; "
                          "pass a local path")


def model_folder(name: str, role: str) -> tuple[str, str | None]:
    """What `from_pretrained` loads for `name` (a GGUF file: its cached HF folder), and the GGUF
    file's SHA-256 where it is one."""
    if is_gguf(name) and Path(name).expanduser().is_file():
        folder, sha = hf_folder(name, role)
        return str(folder), sha
    return name, None


def share_vocabulary(target: torch.nn.Module, draft: torch.nn.Module, tokenizer, draft_tokenizer) -> None:
    """Refuse a pair whose vocabularies differ; align one that only pads its LM head differently.

    Model families pad the output layer to different sizes (Qwen2.5: 152,064 rows for 7B,
    151,936 for 0.5B) while sharing one tokenizer. The rows past the smaller head are padding
    no tokenizer produces, so both models are cut to the shared size — baseline included, so
    speedup and losslessness are measured on the same vocabulary.
    """
    target_size = target.get_output_embeddings().weight.shape[0]
    draft_size = draft.get_output_embeddings().weight.shape[0]
    if target_size == draft_size:
        return
    refusal = DsparkError(
        f"target and draft vocabularies differ ({target_size} vs {draft_size} tokens); "
        "speculative decoding needs a draft that shares the target's vocabulary"
    )
    try:
        other = draft_tokenizer()
    except DsparkError:
        raise refusal from None
    shared = min(target_size, draft_size)
    if other.get_vocab() != tokenizer.get_vocab() or len(tokenizer) > shared:
        raise refusal
    for model in (target, draft):
        if model.get_output_embeddings().weight.shape[0] != shared:
            model.resize_token_embeddings(shared)


def model_fingerprint(model: torch.nn.Module, with_config: bool = True) -> str:
    """Short hash of a model's config and weights: equal models give equal fingerprints."""
    # Where the weights were loaded from, and by which transformers, is not part of the model.
    config = ({k: v for k, v in model.config.to_dict().items()
               if k not in ("_name_or_path", "name_or_path", "transformers_version", "_commit_hash")}
              if with_config else {})
    digest = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode())
    with torch.inference_mode():
        for name, param in sorted(model.state_dict().items()):
            # The sum and a strided sample of values identify weights without hashing them all.
            flat = param.detach().float().flatten()
            sample = flat[:: max(1, flat.numel() // 64)][:64]
            digest.update(f"{name}{tuple(param.shape)}{float(flat.sum()):.6e}".encode())
            digest.update(sample.cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def context_warning(pair: ModelPair, prompts, max_new_tokens: int, chat_template: str = "auto") -> str | None:
    """One line where a prompt plus max_new_tokens runs past the target's trained context
    (`max_position_embeddings`): a warning, not an error — a user's model may extrapolate, and the
    256-token reference pair's numbers past 256 are part of what docs/depth.md compares."""
    from dspark_bench.tasks.prompts import encode  # the core's; here only for the count

    trained = getattr(pair.target.config, "max_position_embeddings", None)
    if not trained or not prompts:
        return None
    longest = max(len(encode(pair.tokenizer, p.text, chat_template)) for p in prompts)
    if longest + max_new_tokens <= trained:
        return None
    return (f"note: the longest prompt is {longest:,} tokens; with {max_new_tokens} new ones it runs past the target's "
            f"trained context of {trained:,} tokens (a long task's pair: `dspark-bench models build --long`)")



def check_depth_reach(pair: ModelPair, prompts, max_new_tokens: int, configs, chat_template: str = "auto") -> None:
    """Refuse, before anything decodes, a depth policy with an entry for a bucket no round can start
    in: past both the target's trained context and the longest prompt with its new tokens (a round
    starts below that). Such an entry would never be read; the policy's last entry holds for every
    deeper bucket already."""
    from dspark_bench.tasks.prompts import encode  # the core's; here only for the count, as context_warning

    policies = [c.stopping.depth_policy for c in configs if c.stopping.depth_policy]
    if not policies or not prompts:
        return
    trained = getattr(pair.target.config, "max_position_embeddings", None) or 0
    longest = max(len(encode(pair.tokenizer, p.text, chat_template)) for p in prompts) + max_new_tokens
    for text in dict.fromkeys(policies):
        for index, entry in enumerate(depth_entries(text)):
            if DEPTH_EDGES[index] >= max(trained, longest):
                raise DsparkError(f"depth_policy {text!r}: its entry {entry} is for depths {DEPTH_LABELS[index]}, "
                                  f"where no round starts (the longest prompt with its new tokens reaches "
                                  f"{longest:,} tokens, the target's trained context is {trained:,}); drop it: the "
                                  "last entry holds for every deeper bucket")
