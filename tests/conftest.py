import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

import tiny  # noqa: E402

# Tiny models: extra threads only add overhead, and CI shares two cores.
torch.set_num_threads(1)


@pytest.fixture(autouse=True, scope="session")
def prices_home(tmp_path_factory):
    """Engines' measured cost models of these tests go to a folder of their own, not the user's cache."""
    import os

    saved = os.environ.get("DSPARK_PRICES_HOME")
    os.environ["DSPARK_PRICES_HOME"] = str(tmp_path_factory.mktemp("prices"))
    yield Path(os.environ["DSPARK_PRICES_HOME"])
    if saved is None:
        os.environ.pop("DSPARK_PRICES_HOME")
    else:
        os.environ["DSPARK_PRICES_HOME"] = saved


@pytest.fixture(scope="session")
def llama_pair():
    target = tiny.llama()
    return target, tiny.noisy_copy(target, 0.03)


@pytest.fixture(scope="session")
def gpt2_pair():
    target = tiny.gpt2()
    return target, tiny.noisy_copy(target, 0.03)


@pytest.fixture(scope="session")
def saved_pair(tmp_path_factory):
    """A tiny Llama pair with a tokenizer, on disk, loadable by from_pretrained."""
    folder = tmp_path_factory.mktemp("pair")
    target = tiny.llama()
    return tiny.save_pair(folder, target, tiny.noisy_copy(target, 0.03))


@pytest.fixture(scope="session")
def prompts_file(tmp_path_factory) -> Path:
    """Three prompts in two categories, as a JSONL dataset."""
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    rows = [("def add(a, b):", "code"), ("The quick brown fox", "prose"), ("for i in range(", "code")]
    path.write_text("".join(json.dumps({"prompt": p, "category": c}) + "\n" for p, c in rows))
    return path
