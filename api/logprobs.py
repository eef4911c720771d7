"""Token log-probabilities in OpenAI's two shapes: chat's `logprobs.content` and the legacy
completions' `tokens` / `token_logprobs` / `top_logprobs` / `text_offset`.

Each token is shown as its own decoded text (a token holding part of a UTF-8 character decodes
to U+FFFD, and its `bytes` say so, as OpenAI's do).
"""

from __future__ import annotations

from collections.abc import Sequence

from api.errors import ApiError
from api.schemas import ChatCompletionRequest, CompletionRequest
from inference.engine import Engine, TokenLogprob


def requested_logprobs(body: ChatCompletionRequest | CompletionRequest) -> int | None:
    """How many top tokens per position the request asks for (None: no logprobs)."""
    if isinstance(body, CompletionRequest):
        return body.logprobs
    if body.top_logprobs is not None and not body.logprobs:
        raise ApiError(400, "top_logprobs needs logprobs: true.", param="top_logprobs")
    return (body.top_logprobs or 0) if body.logprobs else None


class LogprobsWriter:
    """Turns the engine's `TokenLogprob`s into OpenAI's JSON, decoding with the engine's
    tokenizer (under its lock: the engine thread shares it)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def _texts(self, logprobs: Sequence[TokenLogprob]) -> dict[int, str]:
        """Each token id the logprobs mention (picked or top), decoded alone, once."""
        ids = {lp.token_id for lp in logprobs} | {t for lp in logprobs for t, _ in lp.top}
        tokenizer = self._engine.tokenizer
        with self._engine.tokenizer_lock:
            return {token_id: tokenizer.decode([token_id]) for token_id in ids}

    def chat(self, logprobs: Sequence[TokenLogprob]) -> dict:
        texts = self._texts(logprobs)

        def entry(token_id: int, logprob: float) -> dict:
            text = texts[token_id]
            return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

        return {
            "content": [
                entry(lp.token_id, lp.logprob)
                | {"top_logprobs": [entry(token_id, value) for token_id, value in lp.top]}
                for lp in logprobs
            ]
        }

    def completion(self, logprobs: Sequence[TokenLogprob], text_offset: int = 0) -> dict:
        texts = self._texts(logprobs)
        offsets, offset = [], text_offset
        for lp in logprobs:
            offsets.append(offset)
            offset += len(texts[lp.token_id])
        return {
            "tokens": [texts[lp.token_id] for lp in logprobs],
            "token_logprobs": [lp.logprob for lp in logprobs],
            "top_logprobs": [{texts[t]: value for t, value in lp.top} for lp in logprobs],
            "text_offset": offsets,
        }
