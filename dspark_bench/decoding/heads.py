"""Multi-token heads on the target (Medusa-style, semi-autoregressive drafting).

Head i (1-based) reads the target's last hidden state h_t — the one whose LM head gives the
token t+1 — and predicts the token t+1+i: i+1 positions ahead. A head is one residual block
h + SiLU(W_i h + b_i) followed by the target's own (frozen) LM head, as in Medusa-1; W_i starts
at zero, so an untrained head repeats the target's next-token guess. Only the blocks are
stored: k × (hidden² + hidden) parameters, a small fp16 file beside the target it was trained on.

The heads need no forward of their own model: the target's verify pass computes h at every
position, and the drafter keeps the one the round's last token came from (drafters.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from dspark_bench.errors import DsparkError
from dspark_bench.results import atomic_write, write_text

WEIGHTS = "heads.safetensors"
INFO = "heads.json"


class Heads(torch.nn.Module):
    def __init__(self, hidden: int, count: int):
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(hidden, hidden) for _ in range(count))
        for block in self.blocks:
            torch.nn.init.zeros_(block.weight)
            torch.nn.init.zeros_(block.bias)
        self.lm_head: torch.nn.Module | None = None  # the target's, attached by `attach` (not stored)
        self.info: dict = {}

    @property
    def count(self) -> int:
        return len(self.blocks)

    def attach(self, target: torch.nn.Module) -> "Heads":
        """Share the target's LM head (frozen, never copied into the heads' file). Kept outside
        the module's registry, so it is neither a parameter of the heads nor in their state."""
        object.__setattr__(self, "lm_head", target.get_output_embeddings())
        return self

    def forward(self, hidden: torch.Tensor, count: int | None = None) -> torch.Tensor:
        """Logits of the first `count` heads (default all) from hidden states [..., hidden]:
        [..., count, vocab]."""
        blocks = self.blocks[: self.count if count is None else count]
        return self.lm_head(torch.stack([hidden + F.silu(block(hidden)) for block in blocks], dim=-2))


def target_hidden(target: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """The target's last hidden state (after its final norm: what its LM head reads) [..., T, hidden]."""
    return target(input_ids=ids, output_hidden_states=True).hidden_states[-1]


def target_identity(target: torch.nn.Module) -> dict:
    """What heads.json keeps of the target they were trained on, so that it is recognised in any
    dtype or device (bf16 on a GPU, fp32 here): its config (less dtype and paths) and the
    total |weight| (rounding to another dtype moves it by far less than the tolerance of `same_target`)."""
    import hashlib

    skip = ("_name_or_path", "name_or_path", "transformers_version", "_commit_hash", "dtype", "torch_dtype")
    config = {k: v for k, v in target.config.to_dict().items() if k not in skip}
    digest = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]
    with torch.inference_mode():
        mass = sum(float(p.detach().double().abs().sum()) for p in target.parameters())
    return {"config": digest, "weight_mass": mass}


def same_target(recorded: dict, target: torch.nn.Module) -> bool:
    now = target_identity(target)
    return recorded["config"] == now["config"] and abs(recorded["weight_mass"] - now["weight_mass"]) <= \
        1e-3 * abs(recorded["weight_mass"])


def save(heads: Heads, folder: Path, info: dict) -> None:
    """The heads as fp16 safetensors plus heads.json (shape, target fingerprint, training)."""

    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().half().contiguous() for k, v in heads.state_dict().items()}
    atomic_write(folder / WEIGHTS, lambda partial: save_file(state, str(partial)))
    (folder / WEIGHTS).chmod(0o644)  # shipped in the package: readable by every user
    write_text(folder / INFO, json.dumps({**info, "count": heads.count,
                                          "hidden": heads.blocks[0].in_features}, indent=2) + "\n")


def load(folder: Path | str, target: torch.nn.Module) -> Heads:
    """Heads trained on `target`, in the target's device and dtype; refused for another target."""
    folder = Path(folder).expanduser()
    if not (folder / WEIGHTS).is_file() or not (folder / INFO).is_file():
        raise DsparkError(f"{str(folder)!r} holds no heads ({WEIGHTS} + {INFO}); build them with "
                          "`dspark-bench models build --heads`")
    try:
        info = json.loads((folder / INFO).read_text())
        if not isinstance(info, dict) or int(info["count"]) < 1:
            raise ValueError(f"{INFO} must hold an object with a count of at least 1")
        state = load_file(str(folder / WEIGHTS))
        heads = Heads(int(info["hidden"]), int(info["count"]))
        heads.load_state_dict(state, strict=True)  # every head's weights, nothing else
    except (OSError, KeyError, ValueError, TypeError, RuntimeError, SafetensorError, json.JSONDecodeError) as err:
        raise DsparkError(f"the heads in {str(folder)!r} are unreadable: {str(err).splitlines()[0]}") from None
    if "target" in info and isinstance(info["target"], dict) and not same_target(info["target"], target):
        raise DsparkError(f"the heads in {str(folder)!r} were trained on another target; train heads for this one "
                          "with `dspark-bench models build --heads --target ...`")
    hidden = target.get_output_embeddings().weight.shape[1]
    if heads.blocks[0].in_features != hidden:
        raise DsparkError(f"the heads in {str(folder)!r} read {heads.blocks[0].in_features}-wide hidden states; "
                          f"the target's are {hidden} wide")
    weight = target.get_output_embeddings().weight
    heads = heads.to(device=weight.device, dtype=weight.dtype).eval().attach(target)
    heads.info = info
    return heads
