"""A draft model must share its target's vocabulary: real tokenizers, checked at load."""

from __future__ import annotations

import pytest
from transformers import AutoConfig, AutoTokenizer

from inference.engine.config import ConfigError
from inference.engine.draft_vocabulary import check_draft_vocabulary

QWEN_CODER_05B = "qwen2.5-coder-0.5b-instruct"
QWEN_CODER_15B = "qwen2.5-coder-1.5b-instruct"


@pytest.fixture(scope="module")
def catalogue_vocabulary(prepared_catalogue_model):
    """Factory: a catalogue model's (name, tokenizer, vocabulary size of its embedding)."""

    def read(name: str):
        directory = prepared_catalogue_model(name)
        tokenizer = AutoTokenizer.from_pretrained(str(directory))
        return name, tokenizer, AutoConfig.from_pretrained(str(directory)).vocab_size

    return read


@pytest.fixture(scope="module")
def smollm2(real_tokenizer):
    return "smollm2-135m-instruct", real_tokenizer, 49152


def test_a_model_may_draft_for_itself(smollm2):
    check_draft_vocabulary(smollm2, smollm2)


def test_a_truncated_vocabulary_is_refused_naming_both_models(smollm2):
    _, tokenizer, size = smollm2
    with pytest.raises(ConfigError) as error:
        check_draft_vocabulary(smollm2, ("truncated-draft", tokenizer, size - 64))
    message = str(error.value)
    assert message.startswith("draft_model_dir truncated-draft cannot draft for smollm2-135m")
    assert "vocabulary sizes differ (49152 vs 49088)" in message


def test_another_models_tokenizer_is_refused_even_at_the_same_vocabulary_size(
    smollm2, catalogue_vocabulary
):
    name, tokenizer, _ = catalogue_vocabulary(QWEN_CODER_05B)
    with pytest.raises(ConfigError, match="is tokenized differently") as error:
        check_draft_vocabulary(smollm2, (name, tokenizer, smollm2[2]))
    assert "vocabulary sizes differ" not in str(error.value)


def test_the_qwen_coder_models_share_a_vocabulary(catalogue_vocabulary):
    target, draft = catalogue_vocabulary(QWEN_CODER_15B), catalogue_vocabulary(QWEN_CODER_05B)
    assert target[2] == draft[2] == 151936
    check_draft_vocabulary(target, draft)
