"""bench.workload: the engine benchmarks' prompts share a system turn and differ after it."""

from __future__ import annotations

from bench.workload import Workload, build_prompts


def test_prompts_have_the_requested_shape(chat_model_dir) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(chat_model_dir)
    workload = Workload(system_tokens=100, user_tokens=30)
    first, second = build_prompts(tokenizer, workload, 2, first_seed=1)
    shared = next(i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b)
    assert 100 <= shared <= 115  # the system turn (plus template tokens) is a common prefix
    assert 130 <= len(first) <= 150
    assert first != second


def test_a_base_model_without_a_chat_template_gets_the_turns_as_plain_text(chat_model_dir) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(chat_model_dir)
    tokenizer.chat_template = None  # as a base model's (Gemma 3 270M) has none
    workload = Workload(system_tokens=40, user_tokens=10)
    first, second = build_prompts(tokenizer, workload, 2, first_seed=1)
    text = tokenizer.decode(first)
    assert "<|im_start|>" not in text and "\n\n" in text
    assert 50 <= len(first) <= 55
    assert first[:40] == second[:40] and first != second
