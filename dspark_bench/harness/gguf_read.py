"""Open a GGUF model file (`--target model.gguf`, `--draft draft.gguf`) as a Hugging Face model.

transformers reads GGUF itself (`from_pretrained(folder, gguf_file=name)`), dequantizing every
tensor to fp32 — minutes for a 7B file, and again at every load. It also refuses to
`save_pretrained` the model it made ("quantized with gguf and is not serializable"), so the
dequantized model is rebuilt from its config and state dict, and that copy is saved once as an
ordinary HF folder (safetensors, config, generation config, tokenizer). Later loads read that
folder: seconds.

The folder is keyed by the file's SHA-256, so a changed file converts again and a renamed one
does not; the hash is recorded in run.json beside the model's own fingerprint.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path

from dspark_bench.errors import DsparkError, first_line
from dspark_bench.results import cache_dir

MAGIC = b"GGUF"  # every GGUF file starts with these four bytes


def is_gguf(name: str) -> bool:
    return Path(name).suffix.lower() == ".gguf"


def cache_home() -> Path:
    """Where converted folders live (DSPARK_GGUF_HF_HOME, else ~/.cache/dspark-bench/gguf-hf)."""
    return cache_dir("gguf-hf", "DSPARK_GGUF_HF_HOME")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def hf_folder(path: str | Path, role: str) -> tuple[Path, str]:
    """(the HF folder holding the GGUF file's model and tokenizer, the file's SHA-256);
    converted on first use."""
    path = Path(path).expanduser()
    try:
        with open(path, "rb") as handle:
            if handle.read(4) != MAGIC:
                raise DsparkError(f"the {role} model {str(path)!r} is not a GGUF file (it does not start with 'GGUF')")
        sha = file_sha256(path)
    except OSError as err:
        raise DsparkError(f"cannot read the {role} GGUF file {str(path)!r}: {err.strerror or err}") from None
    folder = cache_home() / sha[:16]
    if not (folder / "config.json").is_file():
        convert(path, folder, role)
    return folder, sha


def convert(path: Path, folder: Path, role: str) -> None:
    """Dequantize `path` with transformers and save it as an HF folder, whole or not at all."""
    try:
        import accelerate  # noqa: F401 — transformers' GGUF loader needs both
        import gguf  # noqa: F401
    except ImportError as err:
        raise DsparkError(f"loading a GGUF model needs the {err.name!r} package: "
                          "pip install 'dspark-bench[gguf]'") from None
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        loaded = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    except Exception as err:  # noqa: BLE001 — a truncated file fails in numpy, struct or gguf, an unknown architecture in transformers
        raise DsparkError(f"cannot load the {role} GGUF file {str(path)!r}: {first_line(err)}") from None
    # Rebuilt on the meta device and given the loaded tensors themselves: one copy of the weights, not two.
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(loaded.config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), assign=True)
    model.tie_weights()
    model.generation_config = loaded.generation_config
    del loaded
    folder.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{folder.name}-",
                                    dir=folder.parent))  # two converting processes never share it
    try:
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        # Which file this came from, for a reader of the cache.
        (partial / "source.txt").write_text(f"{path.resolve()}\n")
        partial.rename(folder)  # an interrupted conversion leaves no folder that looks done
    except OSError:
        if not (folder / "config.json").is_file():  # not another process's finished folder: a real failure
            raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
