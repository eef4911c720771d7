"""What the engine hands back: text deltas, per-request usage, whole results, and its errors."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from inference.engine.core.sequence import Sequence


class PromptTooLongError(ValueError):
    """The prompt leaves no room to generate within max_model_len; raised before queueing."""

    def __init__(self, num_prompt_tokens: int, max_model_len: int):
        super().__init__(
            f"prompt has {num_prompt_tokens} tokens but max_model_len is {max_model_len}: "
            f"the prompt plus at least one generated token must fit "
            f"(at most {max_model_len - 1} prompt tokens); shorten it or raise max_model_len"
        )
        self.num_prompt_tokens = num_prompt_tokens
        self.max_model_len = max_model_len


class EngineClosedError(RuntimeError):
    """The engine was shut down; it takes no new requests."""


class RequestFailedError(RuntimeError):
    """The engine failed while running this request (the engine itself keeps running)."""

    def __init__(self, request_id: str, cause: BaseException):
        super().__init__(f"request {request_id} failed inside the engine: {cause!r}")
        self.request_id = request_id


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """A generated token's log-probability, and the most likely tokens' at its position (best
    first; as many as the request's `logprobs`)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class Delta:
    """New output of one request since its previous delta.

    `text` may be "" (a token whose bytes do not finish a character yet, or text held back as a
    possible stop string start). `finish_reason` is set on the last delta: "stop" (eos, a stop
    token or stop string), "length" (max_tokens or max_model_len) or "abort".
    """

    request_id: str
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str | None = None
    # One per token of token_ids when the request asked for logprobs, else empty.
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts and timings of one finished request.

    `ttft_s` is arrival to first token (None when aborted before one); `tokens_per_s` is the
    decode speed after the first token (0.0 with fewer than two tokens); `total_s` is arrival to
    finish.
    """

    request_id: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    ttft_s: float | None
    tokens_per_s: float
    total_s: float
    num_preemptions: int = 0
    # Prompt tokens whose keys/values came from passages computed on their own (chunk-KV reuse)
    reused_tokens: int = 0

    @classmethod
    def from_sequence(cls, seq: Sequence) -> Usage:
        ttft_s = None
        tokens_per_s = 0.0
        # NOTE: the first token sets both times (Sequence.append_token)
        if seq.first_token_time is not None and seq.last_token_time is not None:
            ttft_s = seq.first_token_time - seq.arrival_time
            decode_s = seq.last_token_time - seq.first_token_time
            if seq.num_completion_tokens > 1 and decode_s > 0:
                tokens_per_s = (seq.num_completion_tokens - 1) / decode_s
        finish_time = seq.finish_time if seq.finish_time is not None else seq.arrival_time
        return cls(
            request_id=seq.request_id,
            prompt_tokens=seq.num_prompt_tokens,
            cached_tokens=seq.num_cached_tokens,
            completion_tokens=seq.num_completion_tokens,
            ttft_s=ttft_s,
            tokens_per_s=tokens_per_s,
            total_s=finish_time - seq.arrival_time,
            num_preemptions=seq.num_preemptions,
            reused_tokens=seq.num_reused_tokens,
        )


@dataclass(frozen=True, slots=True)
class GenerationResult:
    """One request's whole output, as returned by `Engine.generate`."""

    request_id: str
    text: str
    token_ids: list[int]
    finish_reason: str
    usage: Usage
    logprobs: list[TokenLogprob] = field(default_factory=list)  # when the request asked


class ResultCollector:
    """Gathers one request's outputs for `generate` (called on the engine thread)."""

    def __init__(self) -> None:
        self.items: list[Delta | Usage | BaseException] = []
        self.done = threading.Event()

    def __call__(self, item: Delta | Usage | BaseException) -> None:
        self.items.append(item)
        if isinstance(item, Usage | BaseException):
            self.done.set()

    def result(self) -> GenerationResult:
        last = self.items[-1]
        if isinstance(last, BaseException):
            raise last
        deltas = [item for item in self.items if isinstance(item, Delta)]
        finish_reason = deltas[-1].finish_reason
        # NOTE: the engine ends every request with a finishing delta and then its usage.
        if not isinstance(last, Usage) or finish_reason is None:
            raise RuntimeError(f"request {last.request_id} has not finished")
        return GenerationResult(
            request_id=last.request_id,
            text="".join(d.text for d in deltas),
            token_ids=[t for d in deltas for t in d.token_ids],
            finish_reason=finish_reason,
            usage=last,
            logprobs=[lp for d in deltas for lp in d.logprobs],
        )
