"""SamplingParams: how one request picks its tokens and when it stops."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from inference.engine.core.structured_output import StructuredOutput

MAX_PENALTY = 2.0
MAX_LOGPROBS = 20  # OpenAI's top_logprobs limit


@dataclass(slots=True)
class SamplingParams:
    """Per-request sampling settings, validated on creation (ValueError with the field name).

    - `temperature == 0` is greedy; top_p / top_k / seed then have no effect.
    - `top_k=None` keeps every token; `top_p=1.0` likewise.
    - `seed` makes the request's samples reproducible, whatever else shares its batch.
    - `max_tokens=None` generates until a stop condition or the engine's `max_model_len`.
    - `stop` strings end the output and are not part of it; `stop_token_ids` likewise end it
      (the token is counted, its text is not emitted). The model's eos token stops generation
      unless `ignore_eos`.
    - presence / frequency penalties follow the OpenAI definition over the generated tokens.
    - `logprobs` (None: none) returns, with each generated token, its log-probability under the
      model's distribution (before temperature, penalties or a grammar's mask, as vLLM reports
      it) and the `logprobs` most likely tokens' (0: the chosen token's only).
    - `structured_output` constrains the output to a grammar (JSON, a JSON Schema, a tool-call
      format); the request then finishes with "stop" as soon as the grammar is complete, or
      "length" if max_tokens ran out first (its output is then an unfinished document).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    seed: int | None = None
    max_tokens: int | None = 256
    stop: tuple[str, ...] | list[str] | str = ()
    stop_token_ids: tuple[int, ...] | list[int] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    ignore_eos: bool = False
    structured_output: StructuredOutput | None = None
    logprobs: int | None = None

    def __post_init__(self) -> None:
        self.temperature = _number("temperature", self.temperature)
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 means greedy), got {self.temperature}")
        self.top_p = _number("top_p", self.top_p)
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k is not None:
            _integer("top_k", self.top_k)
            if self.top_k < 1:
                raise ValueError(f"top_k must be >= 1 or None (no limit), got {self.top_k}")
        if self.seed is not None:
            _integer("seed", self.seed)
            if not 0 <= self.seed < 2**63:
                raise ValueError(f"seed must be in [0, 2**63), got {self.seed}")
        if self.max_tokens is not None:
            _integer("max_tokens", self.max_tokens)
            if self.max_tokens < 1:
                raise ValueError(f"max_tokens must be >= 1 or None, got {self.max_tokens}")
        self.stop = _stop_strings(self.stop)
        self.stop_token_ids = _token_ids(self.stop_token_ids)
        for name in ("presence_penalty", "frequency_penalty"):
            value = _number(name, getattr(self, name))
            if not -MAX_PENALTY <= value <= MAX_PENALTY:
                raise ValueError(f"{name} must be in [-2, 2], got {value}")
            setattr(self, name, value)
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be True or False, got {self.ignore_eos!r}")
        if self.logprobs is not None:
            _integer("logprobs", self.logprobs)
            if not 0 <= self.logprobs <= MAX_LOGPROBS:
                raise ValueError(f"logprobs must be in [0, {MAX_LOGPROBS}], got {self.logprobs}")
        if self.structured_output is not None and not isinstance(
            self.structured_output, StructuredOutput
        ):
            raise ValueError(
                f"structured_output must be a StructuredOutput, got {self.structured_output!r}"
            )

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{name} must be finite, got {value}")
    return float(value)


def _integer(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")


def _stop_strings(stop: object) -> tuple[str, ...]:
    if isinstance(stop, str):
        stop = (stop,)
    if not isinstance(stop, Iterable):
        raise ValueError(f"stop must be a string or a list of strings, got {stop!r}")
    strings = tuple(stop)
    for value in strings:
        if not isinstance(value, str) or not value:
            raise ValueError(f"stop strings must be non-empty strings, got {value!r}")
    return strings


def _token_ids(token_ids: object) -> tuple[int, ...]:
    if isinstance(token_ids, str | bytes) or not isinstance(token_ids, Iterable):
        raise ValueError(f"stop_token_ids must be a list of token ids, got {token_ids!r}")
    ids = tuple(token_ids)
    for value in ids:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"stop_token_ids must be non-negative integers, got {value!r}")
    return ids
