"""EngineCore: what the engine thread owns — scheduler, KV blocks, runner, sampler, outputs.

Nothing here is thread-safe, on purpose: only the engine thread calls it (the `Engine` front
queues other threads' commands). `step()` is schedule -> run -> postprocess; postprocessing
appends each sampled token, detokenizes it, checks the stop conditions and hands a `Delta` (and
at the end a `Usage`) to the request's output callback.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from inference.engine.block_manager import BlockManager
from inference.engine.config import EngineConfig
from inference.engine.detokenizer import IncrementalDetokenizer
from inference.engine.metrics import EngineMetrics
from inference.engine.model_runner import BatchEntry, ModelRunner
from inference.engine.outputs import Delta, RequestFailedError, Usage
from inference.engine.sampler import Sampler
from inference.engine.scheduler import Scheduler, SchedulerOutput
from inference.engine.sequence import FinishReason, Sequence

logger = logging.getLogger(__name__)

# Called on the engine thread with each Delta, then the Usage, or a RequestFailedError instead.
OutputCallback = Callable[[Delta | Usage | BaseException], None]


@dataclass(slots=True, eq=False)
class Request:
    seq: Sequence
    detokenizer: IncrementalDetokenizer
    on_output: OutputCallback | None


class EngineCore:
    def __init__(
        self,
        config: EngineConfig,
        runner: ModelRunner,
        *,
        max_model_len: int,
        eos_token_ids: frozenset[int],
        on_request_done: Callable[[str], None],
    ) -> None:
        self.runner = runner
        self.max_model_len = max_model_len
        self.eos_token_ids = eos_token_ids
        self.on_request_done = on_request_done
        self.block_manager = BlockManager(
            runner.num_kv_blocks,
            config.block_size,
            enable_prefix_caching=config.enable_prefix_caching,
        )
        self.scheduler = Scheduler(
            self.block_manager,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
        )
        self.sampler = Sampler()
        self.metrics = EngineMetrics()
        self.requests: dict[str, Request] = {}
        self._last_output: SchedulerOutput | None = None

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    def add(self, request: Request) -> None:
        self.requests[request.seq.request_id] = request
        self.scheduler.add(request.seq)

    def abort(self, request_id: str) -> None:
        request = self.requests.get(request_id)
        if request is None:
            return  # unknown or already finished
        self.scheduler.finish(request.seq, FinishReason.ABORT)
        self._deliver(request, Delta(request_id, "", (), FinishReason.ABORT.value))
        self._complete(request, FinishReason.ABORT.value)

    def abort_all(self) -> None:
        for request_id in list(self.requests):
            self.abort(request_id)
        self.record_metrics()

    def step(self) -> bool:
        """One iteration: schedule, run the model, sample, deliver. False if nothing could run."""
        output = self._last_output = self.scheduler.schedule()
        token_ids: list[int] = []
        if not output.is_empty:
            sampled_seqs, token_ids = self._execute(output)
            self._postprocess(output, sampled_seqs, token_ids)
        self._last_output = None
        self.record_metrics(output, num_generated=len(token_ids))
        return not output.is_empty or output.num_preempted > 0

    def fail_step(self, error: Exception) -> None:
        """Fail the requests of the step that raised.

        If the error came from outside a scheduled step (scheduling itself, commands), every
        request fails: their bookkeeping can no longer be trusted.
        """
        output, self._last_output = self._last_output, None
        if output is not None and not output.is_empty:
            seqs = output.seqs
        else:
            seqs = [request.seq for request in self.requests.values()]
        for seq in seqs:
            request = self.requests.get(seq.request_id)
            if request is None:
                continue
            try:
                self.scheduler.finish(seq, FinishReason.ABORT)
            except Exception:
                logger.exception("could not release the KV blocks of %s", seq.request_id)
            self._complete(request, "error", RequestFailedError(seq.request_id, error))
        self.record_metrics()

    def record_metrics(self, output: SchedulerOutput | None = None, num_generated: int = 0) -> None:
        self.metrics.record_step(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            kv_usage=self.block_manager.usage,
            num_preempted=output.num_preempted if output is not None else 0,
            num_generated=num_generated,
        )

    def _execute(self, output: SchedulerOutput) -> tuple[list[Sequence], list[int]]:
        entries, sample_rows = [], []
        for row, (seq, num_tokens) in enumerate(
            zip(output.seqs, output.num_scheduled_tokens, strict=True)
        ):
            start = seq.num_computed_tokens
            entries.append(
                BatchEntry(seq.token_ids[start : start + num_tokens], start, seq.block_table)
            )
            if start + num_tokens == seq.num_tokens:
                sample_rows.append(row)
        logits = self.runner.execute(entries)
        if not sample_rows:
            return [], []
        if len(sample_rows) < len(entries):
            logits = logits[torch.tensor(sample_rows)]
        sampled_seqs = [output.seqs[row] for row in sample_rows]
        return sampled_seqs, self.sampler(logits, sampled_seqs)

    def _postprocess(
        self, output: SchedulerOutput, sampled_seqs: list[Sequence], token_ids: list[int]
    ) -> None:
        now = time.monotonic()
        self.scheduler.update_from_output(output)
        for seq, token_id in zip(sampled_seqs, token_ids, strict=True):
            self._process_token(self.requests[seq.request_id], token_id, now)

    def _process_token(self, request: Request, token_id: int, now: float) -> None:
        seq, params, detokenizer = request.seq, request.seq.params, request.detokenizer
        previous_token_time = seq.last_token_time
        seq.append_token(token_id, now)
        if previous_token_time is None:
            self.metrics.record_first_token(
                now - seq.arrival_time, seq.num_prompt_tokens, seq.num_cached_tokens
            )
        else:
            self.metrics.record_inter_token_latency(now - previous_token_time)

        finish_reason = None
        if token_id in params.stop_token_ids or (
            not params.ignore_eos and token_id in self.eos_token_ids
        ):
            finish_reason = FinishReason.STOP
            text = detokenizer.flush()  # held-back text was not a stop string after all
        else:
            text = detokenizer.update(token_id)
            if detokenizer.is_stopped:
                finish_reason = FinishReason.STOP
            elif (
                params.max_tokens is not None and seq.num_completion_tokens >= params.max_tokens
            ) or seq.num_tokens >= self.max_model_len:
                finish_reason = FinishReason.LENGTH
                text += detokenizer.flush()
        if finish_reason is None:
            self._deliver(request, Delta(seq.request_id, text, (token_id,)))
            return
        self.scheduler.finish(seq, finish_reason)
        self._deliver(request, Delta(seq.request_id, text, (token_id,), finish_reason.value))
        self._complete(request, finish_reason.value)

    def _complete(
        self, request: Request, finish_reason: str, error: BaseException | None = None
    ) -> None:
        request_id = request.seq.request_id
        if self.requests.pop(request_id, None) is None:
            return  # already completed (its consumer failed while receiving the last delta)
        self.on_request_done(request_id)
        self.metrics.record_finished(finish_reason)
        self._deliver(request, error if error is not None else Usage.from_sequence(request.seq))

    def _deliver(self, request: Request, item: Delta | Usage | BaseException) -> None:
        if request.on_output is None:
            return
        try:
            request.on_output(item)
        except Exception:
            # NOTE: typically the consumer's event loop is gone; nobody can read the rest.
            logger.warning("dropping output of %s: its consumer failed", request.seq.request_id)
            request.on_output = None
            self.abort(request.seq.request_id)
