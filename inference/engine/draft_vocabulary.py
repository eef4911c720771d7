"""Whether a draft model may draft for a target: the same token ids for the same text.

Drafts are token ids of the draft's vocabulary that the target verifies as its own, so both must
mean the same thing by every id. Checked at load: the vocabulary sizes (a draft id beyond the
target's embedding would fail its step), the ids of a few probe texts (code, prose, non-Latin
scripts, emoji, spacing) and of every special token either tokenizer declares (the chat template
and the end of an answer are spelled with them).
"""

from __future__ import annotations

from typing import Any

from inference.engine.config import ConfigError

PROBE_TEXTS = (
    "def fibonacci(n: int) -> int:\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
    "The passage says: book flights at least 14 days before departure.",
    "  Zürich, 東京 and Москва — naïve café 🙂\t\n\n",
)

# (name as users know it, tokenizer, vocabulary size of the model's embedding)
ModelVocabulary = tuple[str, Any, int]


def check_draft_vocabulary(target: ModelVocabulary, draft: ModelVocabulary) -> None:
    """ConfigError naming both models and the first differences, unless the vocabularies match."""
    target_name, target_tokenizer, target_size = target
    draft_name, draft_tokenizer, draft_size = draft
    problems = []
    if target_size != draft_size:
        problems.append(f"vocabulary sizes differ ({target_size} vs {draft_size})")
    for text in PROBE_TEXTS:
        target_ids = target_tokenizer.encode(text, add_special_tokens=False)
        draft_ids = draft_tokenizer.encode(text, add_special_tokens=False)
        if target_ids != draft_ids:
            problems.append(f"{text[:24]!r}... is tokenized differently")
            break
    special_tokens = sorted(
        set(target_tokenizer.all_special_tokens) | set(draft_tokenizer.all_special_tokens)
    )
    for token in special_tokens:
        target_id = target_tokenizer.convert_tokens_to_ids(token)
        draft_id = draft_tokenizer.convert_tokens_to_ids(token)
        if target_id != draft_id:
            problems.append(f"special token {token!r} has id {target_id} vs {draft_id}")
            break
    if problems:
        raise ConfigError(
            f"draft_model_dir {draft_name} cannot draft for {target_name}: they do not share a "
            f"vocabulary ({'; '.join(problems)}); use a draft of the same model family"
        )
