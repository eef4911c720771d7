"""Answers in the user's language: the instruction lives in the fixed system prefix.

The built-in system prompt asks for the question's language (chat.models.DEFAULT_SYSTEM_PROMPT);
being fixed text, every chat of a profile, whatever its language, starts with the same token ids
and hits the same cached prefix. The default model (Qwen2.5-Coder-1.5B) then answers a Chinese
question over an English passage in Chinese and an English question over a Chinese passage in
English (the passages are from eval/debian-reference-*). The 0.5B cannot show it: it copies the
passage whatever the prompt asks.
"""

# ruff: noqa: RUF001 (Chinese text has full-width punctuation)

from __future__ import annotations

import datetime

import pytest
from transformers import AutoTokenizer

from chat.models import DEFAULT_SYSTEM_PROMPT
from chat.prompt import build_with_passages
from evals.answer_metrics import cjk_share
from inference.prompts import PromptBuilder
from retrieval.search import SearchHit

MODEL = "qwen2.5-coder-1.5b-instruct"  # inference.catalogue.DEFAULT_CHAT_MODEL
TODAY = datetime.date(2026, 12, 5)
MAX_TOKENS = 24

ENGLISH_PASSAGE = (
    "Customized display of time and date",
    'The default display format of time and date by the "ls -l" command depends on the locale. '
    'The "$LANG" variable is referred first and it can be overridden by the "$LC_TIME" or '
    '"$LC_ALL" exported environment variables.',
)
CHINESE_PASSAGE = (
    "现代邮件服务限制",
    "现代邮件服务器有一些限制来最小化暴露滥用（不希望和未被要求的电子邮件）问题。 "
    "在消费者级的网络上运行 SMTP 服务器来直接可靠的发送邮件到远端主机是不现实的。 "
    "一个邮件能够被任何主机静悄悄的拒绝，即使路由到了目的地，除非它尽可能看起来是经过认证的。 "
    "这是因为： 从消费者级网络提供的主机连接到互联网的 SMTP 端口（25）已经被封锁了。",
)
CHINESE_QUESTION = "ls -l 显示的日期格式由哪个环境变量决定？会被哪些变量覆盖？"
ENGLISH_QUESTION = (
    "Why is it unrealistic to run my own SMTP server on a home broadband line to deliver mail "
    "directly?"
)


def passage(title: str, text: str) -> SearchHit:
    return SearchHit(
        chunk_id=1, score=1.0, text=text, document_id=1, document_title=title, collection_id=1,
        collection_name="Debian", ordinal=0, page=None, char_start=0, char_end=len(text),
    )  # fmt: skip


def prompt(builder: PromptBuilder, question: str, hit: SearchHit):
    built, _ = build_with_passages(
        builder, question, [hit], [], model_name=MODEL, user_name="Sam", today=TODAY,
        max_tokens=MAX_TOKENS,
    )  # fmt: skip
    return built


def test_chats_in_two_languages_share_the_system_prefix_token_for_token(
    prepared_catalogue_model,
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(prepared_catalogue_model(MODEL))
    builder = PromptBuilder(tokenizer, DEFAULT_SYSTEM_PROMPT, max_model_len=4096)
    chinese = prompt(builder, CHINESE_QUESTION, passage(*ENGLISH_PASSAGE))
    english = prompt(builder, ENGLISH_QUESTION, passage(*CHINESE_PASSAGE))

    num_prefix = chinese.num_prefix_tokens
    assert num_prefix == english.num_prefix_tokens == len(builder.prefix_ids)
    assert chinese.token_ids[:num_prefix] == english.token_ids[:num_prefix] == builder.prefix_ids
    prefix_text = tokenizer.decode(builder.prefix_ids)
    assert "Answer in the language of the question" in prefix_text
    assert prefix_text.endswith(f"{DEFAULT_SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\n")
    # Everything per request comes after the prefix.
    for built, question in ((chinese, CHINESE_QUESTION), (english, ENGLISH_QUESTION)):
        rest = tokenizer.decode(built.token_ids[num_prefix:])
        assert question in rest and "Today is Saturday, December 5, 2026. I am Sam." in rest


@pytest.mark.real_weights
@pytest.mark.usefixtures("torch_threads_on_free_cores")
def test_the_default_model_answers_in_the_language_of_the_question(
    prepared_catalogue_model,
) -> None:
    from inference.engine import Engine, EngineConfig, SamplingParams

    # NOTE: the quantized weights only: what is checked is the answer's language, and on AMX
    # the default ("auto") adds dense copies, 5.8 GB resident against 1.9 (measured), beside
    # the other test process and its servers.
    config = EngineConfig(
        model_dir=prepared_catalogue_model(MODEL), max_model_len=1024, kv_cache_mb=64,
        max_num_seqs=2, prefill_weights="quantized",
    )  # fmt: skip
    with Engine(config) as engine:
        builder = PromptBuilder(
            engine.tokenizer, DEFAULT_SYSTEM_PROMPT, max_model_len=1024,
            tokenizer_lock=engine.tokenizer_lock,
        )  # fmt: skip
        prompts = [
            prompt(builder, CHINESE_QUESTION, passage(*ENGLISH_PASSAGE)).token_ids,
            prompt(builder, ENGLISH_QUESTION, passage(*CHINESE_PASSAGE)).token_ids,
        ]
        chinese, english = engine.generate(
            prompts, SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
        )
    # NOTE: the passages and the user turn's frame ("Question:", today's facts) are in the other
    # language; with the old prompt (no language sentence) the English question's answer comes
    # out in Chinese (share 0.89 in these 24 tokens: checked).
    assert cjk_share(chinese.text) > 0.6, chinese.text
    assert cjk_share(english.text) < 0.1, english.text
