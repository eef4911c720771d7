"""Engine: the public, thread-safe API over one background thread that runs the model.

One thread owns the `EngineCore` (scheduler, KV blocks, model runner); it loops `step()` while
there is work and sleeps on a condition variable when idle. Other threads (the web server's
event loop, Celery, tests) only append commands to a list under a lock: `submit`, `abort`,
`stream`, `generate` and `shutdown` never touch engine state directly. An abort therefore takes
effect (and frees its KV blocks) at the latest when the step in progress ends.

Prompt length: a prompt must leave room for at least one generated token, so prompts of
`max_model_len` tokens or more raise PromptTooLongError before they are queued. A request whose
prompt + max_tokens goes beyond max_model_len is accepted and finishes with "length" when it
reaches max_model_len (as the OpenAI API does when a reply hits the context limit).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
import weakref
from collections.abc import AsyncIterator, Callable
from collections.abc import Sequence as SequenceOf
from pathlib import Path
from typing import Any

import torch

# NOTE: at import, not in the engine thread (see the NOTE on loader.py's transformers import).
from transformers import AutoTokenizer

from inference.engine.config import ConfigError, EngineConfig
from inference.engine.core.chunk_reuse import PASSAGE_PARAMS, passage_key
from inference.engine.core.detokenizer import IncrementalDetokenizer, fast_decoder
from inference.engine.core.reusable_spans import ReusableSpans
from inference.engine.core.sampling_params import SamplingParams
from inference.engine.core.sequence import Sequence
from inference.engine.core.structured_output import StructuredOutput
from inference.engine.core_share import CoreShare
from inference.engine.draft_vocabulary import check_draft_vocabulary
from inference.engine.engine_core import EngineCore, OutputCallback, Request
from inference.engine.grammar import Grammars
from inference.engine.model_runner import ModelRunner
from inference.engine.outputs import (
    Delta,
    EngineClosedError,
    GenerationResult,
    PromptTooLongError,
    ResultCollector,
    Usage,
)

logger = logging.getLogger(__name__)

Prompt = str | SequenceOf[int]
# NOTE: when the core has work it cannot schedule (it should not happen), wait this long between
# tries instead of spinning on the interpreter lock the web server needs.
STALL_WAIT_S = 0.01


class Engine:
    """One model, many concurrent requests. See the module docstring for the threading model.

    `runner` / `tokenizer` may be passed in already loaded (tests, or an engine rebuilt on the
    same weights); `config.dtype`, `kv_cache_mb` and `device` are then the runner's business. So
    may `draft_runner` / `draft_tokenizer`, the draft model's, for speculative_method "draft".
    """

    def __init__(
        self,
        config: EngineConfig,
        *,
        runner: ModelRunner | None = None,
        tokenizer: Any = None,  # a transformers tokenizer; None: the model directory's
        draft_runner: ModelRunner | None = None,
        draft_tokenizer: Any = None,
    ) -> None:
        self.config = config
        self._cond = threading.Condition()
        self._is_closed = False
        # NOTE: the engine thread loads the weights itself (see `_thread_main`); __init__ waits
        # for it and then builds the core, which the thread runs once `_core_ready` is set.
        self._runner_loaded = threading.Event()
        self._core_ready = threading.Event()
        self._load_error: BaseException | None = None
        # the engine thread's thread count while others use the cores; None: adaptive_threads off
        self.core_share: CoreShare | None = None
        self.runner: ModelRunner | None = runner
        self.draft_runner: ModelRunner | None = draft_runner
        self._thread = threading.Thread(target=self._thread_main, name="cachet-engine", daemon=True)
        self._thread.start()
        self._runner_loaded.wait()
        if self._load_error is not None or self.runner is None:
            self._thread.join()
            raise self._load_error or RuntimeError("the engine thread loaded no model")
        try:
            self._build_core(config, self.runner, tokenizer, draft_tokenizer)
        except BaseException:
            self._is_closed = True
            self._core_ready.set()
            self._thread.join()
            raise
        self._core_ready.set()

    def _build_core(
        self, config: EngineConfig, runner: ModelRunner, tokenizer: Any, draft_tokenizer: Any
    ) -> None:
        if tokenizer is None:
            tokenizer = _load_tokenizer(config.model_dir)
        self.tokenizer = tokenizer
        if config.uses_draft_model and self.draft_runner is not None:
            if draft_tokenizer is None and config.draft_model_dir is not None:
                draft_tokenizer = _load_tokenizer(config.draft_model_dir)
            check_draft_vocabulary(
                (str(config.model_dir), tokenizer, runner.vocab_size),
                (str(config.draft_model_dir), draft_tokenizer, self.draft_runner.vocab_size),
            )
        self._decoder = fast_decoder(tokenizer)
        # NOTE: the runner may lower max_model_len to what the model's positions support.
        self.max_model_len = min(config.max_model_len, runner.max_model_len)
        self.vocab_size = runner.vocab_size
        num_blocks = runner.num_kv_blocks
        if num_blocks * config.block_size < self.max_model_len:
            raise ConfigError(
                f"the KV cache has {num_blocks} blocks of {config.block_size} tokens, fewer than "
                f"one max_model_len={self.max_model_len} sequence needs; raise kv_cache_mb or "
                "lower max_model_len"
            )
        # Token ids that end an answer unless ignore_eos (chat history strips them from answers).
        self.eos_token_ids = _eos_token_ids(tokenizer, getattr(runner, "hf_config", None))
        self.core = EngineCore(
            config,
            runner,
            max_model_len=self.max_model_len,
            eos_token_ids=self.eos_token_ids,
            on_request_done=_weakly(self._forget_request_id),
            draft_runner=self.draft_runner,
        )
        self.metrics = self.core.metrics
        # What the engine thread does next, in order: a Request to add, a request id to abort.
        self._commands: list[Request | str] = []
        self._live_request_ids: set[str] = set()
        # NOTE: HF fast tokenizers fail ("Already borrowed") when two threads encode at once;
        # whoever uses `tokenizer` outside the engine holds this lock.
        self.tokenizer_lock = threading.Lock()
        self.grammars = Grammars(
            tokenizer, runner.vocab_size, self.eos_token_ids, tokenizer_lock=self.tokenizer_lock
        )
        logger.info(
            "engine ready: %d KV blocks x %d tokens, max_model_len %d, prefix caching %s",
            num_blocks, config.block_size, self.max_model_len, config.enable_prefix_caching,
        )  # fmt: skip

    # ---- public API (any thread) ----

    def submit(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        cache_salt: str | None = None,
        *,
        on_output: OutputCallback | None = None,
        reusable: ReusableSpans | None = None,
    ) -> str:
        """Queue a request; return its id. `on_output` runs on the engine thread: keep it quick.

        `reusable`: where the prompt holds passages whose keys/values may be reused
        (core/chunk_reuse.py; used when the engine's `chunk_kv_reuse` is on)."""
        request = self._prepare(prompt, params, request_id, cache_salt, on_output, reusable)
        self._enqueue(request)
        return request.seq.request_id

    def stream(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        cache_salt: str | None = None,
        *,
        reusable: ReusableSpans | None = None,
    ) -> AsyncIterator[Delta | Usage]:
        """Async iterator of Deltas then one Usage. Bad input raises here, before queueing.

        The request is queued on the first `__anext__`; cancelling the consumer or closing the
        iterator early (client disconnect) aborts it. `reusable`: as for `submit`.
        """
        request = self._prepare(prompt, params, request_id, cache_salt, None, reusable)
        return self._stream(request)

    def compile_structured_output(self, output: StructuredOutput) -> None:
        """Compile `output`'s grammar now, so the request that uses it starts at once.

        StructuredOutputError if it cannot be served. Compiling a schema takes ~20 ms: callers on
        an event loop call this in a worker thread before `stream` (which would compile it on
        their loop otherwise); the compiled grammar is cached for later requests.
        """
        self.grammars.compile(output)

    def abort(self, request_id: str) -> None:
        """Stop a request and free its KV blocks (at the latest after the current step)."""
        with self._cond:
            self._commands.append(request_id)
            self._cond.notify()

    def generate(
        self,
        prompts: SequenceOf[Prompt],
        params: SamplingParams | SequenceOf[SamplingParams] | None = None,
        *,
        cache_salt: str | None = None,
        reusable: SequenceOf[ReusableSpans | None] | None = None,
    ) -> list[GenerationResult]:
        """Run a batch to completion (blocking); results in prompt order. `reusable`: one
        entry per prompt, as for `submit`.

        Raises RequestFailedError if the engine failed while running one of them.
        """
        per_prompt: SequenceOf[SamplingParams | None]
        if isinstance(params, SamplingParams) or params is None:
            per_prompt = [params] * len(prompts)
        else:
            per_prompt = params
        if len(per_prompt) != len(prompts):
            raise ValueError(f"got {len(per_prompt)} SamplingParams for {len(prompts)} prompts")
        if reusable is None:
            reusable = [None] * len(prompts)
        if len(reusable) != len(prompts):
            raise ValueError(f"got {len(reusable)} reusable entries for {len(prompts)} prompts")
        collectors = [ResultCollector() for _ in prompts]
        requests = [
            self._prepare(prompt, p, None, cache_salt, collector, spans)
            for prompt, p, collector, spans in zip(
                prompts, per_prompt, collectors, reusable, strict=True
            )
        ]
        try:
            for request in requests:
                self._enqueue(request)
            for collector in collectors:
                while not collector.done.wait(timeout=1.0):
                    if not self._thread.is_alive():
                        raise EngineClosedError("the engine thread stopped")
        except BaseException:
            for collector, request in zip(collectors, requests, strict=True):
                if not collector.done.is_set():
                    self.abort(request.seq.request_id)
            raise
        return [collector.result() for collector in collectors]

    def has_unfinished_requests(self) -> bool:
        """Whether any request is queued or running (for draining before a shutdown)."""
        with self._cond:
            return bool(self._live_request_ids)

    def num_unfinished_requests(self) -> int:
        """Requests queued or running (admission control: refuse work beyond a backlog)."""
        with self._cond:
            return len(self._live_request_ids)

    def shutdown(self, timeout: float | None = 10.0) -> None:
        """Abort what is still running and stop the engine thread."""
        with self._cond:
            self._is_closed = True
            self._cond.notify()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    # ---- request preparation (caller's thread) ----

    def _prepare(
        self,
        prompt: Prompt,
        params: object,
        request_id: object,
        cache_salt: object,
        on_output: OutputCallback | None,
        reusable: object = None,
    ) -> Request:
        """The request for a caller's arguments, each checked (they come from outside)."""
        if params is None:
            params = SamplingParams()
        elif not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
        if request_id is None:
            request_id = uuid.uuid4().hex
        elif not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty string, got {request_id!r}")
        if cache_salt is not None and not isinstance(cache_salt, str):
            raise ValueError(f"cache_salt must be a string or None, got {cache_salt!r}")
        token_ids = self._prompt_token_ids(prompt)
        seq = Sequence(request_id, token_ids, params, cache_salt=cache_salt)
        if reusable is not None:
            if not isinstance(reusable, ReusableSpans):
                raise TypeError(f"reusable must be ReusableSpans, got {type(reusable).__name__}")
            reusable.check(len(token_ids))
            seq.reusable = reusable
        if params.structured_output is not None:
            seq.grammar = self.grammars.start(params.structured_output)
        # NOTE: SamplingParams.__post_init__ made `stop` a tuple of strings.
        stop = params.stop if isinstance(params.stop, tuple) else tuple(params.stop)
        detokenizer = IncrementalDetokenizer(self._decoder, token_ids, stop)
        return Request(seq, detokenizer, on_output)

    def _prompt_token_ids(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            # NOTE: HF fast tokenizers may flip their truncation settings inside encode, which
            # fails ("Already borrowed") when two threads encode at once.
            with self.tokenizer_lock:
                token_ids: list[int] = self.tokenizer.encode(prompt)
        else:
            token_ids = list(prompt)
            vocab_size = self.vocab_size
            for token_id in token_ids:
                if isinstance(token_id, bool) or not isinstance(token_id, int):
                    raise ValueError(f"prompt token ids must be integers, got {token_id!r}")
                if not 0 <= token_id < vocab_size:
                    raise ValueError(f"prompt token id {token_id} is outside [0, {vocab_size})")
        if not token_ids:
            raise ValueError("the prompt is empty")
        if len(token_ids) >= self.max_model_len:
            raise PromptTooLongError(len(token_ids), self.max_model_len)
        return token_ids

    def _enqueue(self, request: Request) -> None:
        request_id = request.seq.request_id
        with self._cond:
            if self._is_closed:
                raise EngineClosedError("the engine is shut down")
            if request_id in self._live_request_ids:
                raise ValueError(f"request id {request_id!r} is already in use")
            self._live_request_ids.add(request_id)
            self._commands.append(request)
            self._cond.notify()

    async def _stream(self, request: Request) -> AsyncIterator[Delta | Usage]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Delta | Usage | BaseException] = asyncio.Queue()

        def put(item: Delta | Usage | BaseException) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        request.on_output = put
        self._enqueue(request)
        is_done = False
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    is_done = True
                    raise item
                if isinstance(item, Usage):
                    is_done = True
                yield item
                if is_done:
                    return
        finally:
            if not is_done:
                self.abort(request.seq.request_id)

    # ---- engine thread ----

    def _thread_main(self) -> None:
        """Load the weights (unless given), wait for the core, then run the loop.

        NOTE: all of the engine's torch work happens on this one thread, model loading included.
        libgomp keeps one OpenMP team per thread that ran a parallel region; once a process has
        more pooled OpenMP threads than cores, libgomp throttles their spin-wait and every
        parallel region pays a futex wake-up (measured on 2 cores: ~420 context switches and
        20 -> 28 ms per decode step when the weights were loaded on another thread).
        """
        config = self.config
        try:
            if config.num_threads:
                torch.set_num_threads(config.num_threads)
            if config.adaptive_threads:
                self.core_share = CoreShare(torch.get_num_threads())
            if self.runner is None:
                self.runner = ModelRunner(config)
            if config.uses_draft_model and self.draft_runner is None:
                # NOTE: by default the draft's cache holds as many tokens as the target's.
                num_blocks = self.runner.num_kv_blocks if config.draft_kv_cache_mb is None else None
                self.draft_runner = _load_draft_runner(config, num_blocks)
        except BaseException as error:
            self._load_error = error
            return
        finally:
            self._runner_loaded.set()
        self._core_ready.wait()
        if not self._is_closed:
            self._run_loop()

    def _run_loop(self) -> None:
        while True:
            with self._cond:
                while (
                    not (self._commands or self._is_closed or self.core.has_work)
                    and not self.core.is_warming_up
                ):
                    self._cond.wait()
                commands, self._commands = self._commands, []
                is_closing = self._is_closed
            try:
                self._run_once(commands, is_closing)
            except Exception as error:
                # NOTE: the engine never dies on a bad step: the requests it ran fail with the
                # error (all requests, if it came from outside a step) and the loop goes on.
                logger.exception("engine step failed; failing the requests it ran")
                self.core.fail_step(error)
            if is_closing:
                return

    def _run_once(self, commands: list[Request | str], is_closing: bool) -> None:
        core = self.core
        for command in commands:
            if isinstance(command, Request):
                core.add(command)
            else:
                core.abort(command)
        if is_closing:
            core.close()
        elif not core.has_work:
            core.record_metrics()  # e.g. after an abort: show the freed KV blocks at once
            if core.is_warming_up and not commands:
                core.warm_up()  # NOTE: only while idle: requests come first
        else:
            self._adapt_threads()
            if not core.step():
                logger.warning("the engine has requests but could schedule none; waiting")
                with self._cond:
                    self._cond.wait(STALL_WAIT_S)
            self._add_passage_requests()

    def _add_passage_requests(self) -> None:
        """Compute on their own the passages a blended prompt found nothing to reuse for
        (core/chunk_reuse.py): internal requests nobody reads, whose blocks the prefix cache
        keeps, so the next prompt holding a passage reuses it."""
        core = self.core
        for tokens, cache_salt in core.scheduler.take_missing_passages():
            request_id = "passage-kv-" + passage_key(tokens, cache_salt)
            if request_id not in core.requests:  # NOTE: another prompt may have asked already
                request = self._prepare(tokens, PASSAGE_PARAMS, request_id, cache_salt, None)
                request.is_internal = True
                core.add(request)

    def _adapt_threads(self) -> None:
        """One thread fewer per core other processes keep busy (core_share.py says why)."""
        if self.core_share is None:
            return
        threads = self.core_share.threads()
        if threads != torch.get_num_threads():
            torch.set_num_threads(threads)

    def _forget_request_id(self, request_id: str) -> None:
        with self._cond:
            self._live_request_ids.discard(request_id)


def _weakly(method: Callable[[str], None]) -> Callable[[str], None]:
    """`method` (bound), called only while its object lives.

    NOTE: the core keeps this callback; the bound method itself would hold the engine from its
    own core, a reference cycle that kept a shut-down engine's weights and KV cache (GBs) until
    Python's next full collection, which may be long in coming.
    """
    reference = weakref.WeakMethod(method)

    def call(request_id: str) -> None:
        bound = reference()
        if bound is not None:
            bound(request_id)

    return call


def _load_draft_runner(config: EngineConfig, num_kv_blocks: int | None) -> ModelRunner:
    try:
        return ModelRunner(config.draft_config(), num_kv_blocks=num_kv_blocks, is_draft=True)
    except (ValueError, OSError) as error:
        raise ConfigError(
            f"the draft model {config.draft_model_dir} could not be loaded: {error}"
        ) from error


def _load_tokenizer(model_dir: Path | str) -> Any:
    model_dir = Path(model_dir)
    if model_dir.is_file():
        # NOTE: a bare GGUF file: transformers converts the tokenizer from its metadata (tens of
        # seconds for a large vocabulary; model_files prepares a directory that keeps the result).
        return AutoTokenizer.from_pretrained(str(model_dir.parent), gguf_file=model_dir.name)
    return AutoTokenizer.from_pretrained(str(model_dir))


def _eos_token_ids(tokenizer: Any, hf_config: Any) -> frozenset[int]:
    ids: set[int] = set()
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(tokenizer.eos_token_id)
    config_eos = getattr(hf_config, "eos_token_id", None)
    if isinstance(config_eos, int):
        ids.add(config_eos)
    elif config_eos:
        ids.update(config_eos)
    return frozenset(ids)
