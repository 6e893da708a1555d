"""A prompt and how it becomes token ids."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from dspark_bench.errors import DsparkError


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str
    category: str = "default"
    turns: tuple[str, ...] = ()  # later turns of a multi-turn conversation, if any


def prompts_fingerprint(prompts: list[Prompt]) -> str:
    """Hash of the exact prompts (ids, texts, categories, turns) of a run."""
    digest = hashlib.sha256()
    for prompt in prompts:
        digest.update(json.dumps([prompt.id, prompt.text, prompt.category, list(prompt.turns)]).encode())
    return digest.hexdigest()[:16]


def encode(tokenizer, text: str, chat_template: str = "auto", history: list[tuple[str, str]] = ()) -> list[int]:
    """Token ids of a prompt; through the tokenizer's chat template when it has one.

    `history` holds earlier (user, assistant) turns of a multi-turn conversation.
    """
    if chat_template not in ("auto", "none"):
        raise DsparkError(f"--chat-template must be auto or none (got {chat_template!r})")
    if chat_template == "auto" and getattr(tokenizer, "chat_template", None):
        messages = []
        for user, assistant in history:
            messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
        messages.append({"role": "user", "content": text})
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        return list(ids)
    joined = "".join(user + assistant for user, assistant in history) + text
    ids = tokenizer(joined, add_special_tokens=True)["input_ids"]
    if not ids:
        raise DsparkError("a prompt encodes to no tokens; remove empty prompts")
    return list(ids)
