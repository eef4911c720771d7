"""EngineCore: what the engine thread owns — scheduler, KV blocks, runner, sampler, outputs.

Nothing here is thread-safe, on purpose: only the engine thread calls it (the `Engine` front
queues other threads' commands). `step()` is schedule -> run -> postprocess; postprocessing
appends each sampled token, detokenizes it, checks the stop conditions and hands a `Delta` (and
at the end a `Usage`) to the request's output callback.

Speculative decoding (`num_speculative_tokens` > 0): before scheduling, each decoding sequence
gets drafts, by n-gram lookup (`NgramProposer`) or from a draft model (`DraftProposer`), while at
most `speculative_max_num_seqs` sequences decode.
The model runs the last token plus the drafts in one pass and returns logits for every one of
those positions; the sampler picks a token at each (its picks are a fixed function of the logits,
the seed and the position, see sampler.py). Drafts are accepted while they equal the picks; the
pick at the first mismatch (or after the last draft) is the step's extra token. The output is
therefore token for token what one-token-per-step decoding gives, for greedy and sampled requests
alike. Accepted tokens go through the stop checks one by one, so nothing past a stop is emitted.
Presence/frequency penalties stay exact: the row of draft j is penalised as if drafts 0..j-1
had been generated, which is the only case in which its pick is used.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from inference.engine.config import ConfigError, EngineConfig
from inference.engine.core.block_manager import BlockManager
from inference.engine.core.chunk_reuse import release
from inference.engine.core.detokenizer import IncrementalDetokenizer
from inference.engine.core.reusable_spans import BlendPlan
from inference.engine.core.scheduler import Scheduler, SchedulerOutput
from inference.engine.core.sequence import FinishReason, Sequence
from inference.engine.core.speculative import NgramProposer
from inference.engine.draft_proposer import DraftProposer
from inference.engine.kv_disk_cache import KVDiskCache, kv_fingerprint
from inference.engine.metrics import EngineMetrics
from inference.engine.model_runner import BatchEntry, ModelRunner
from inference.engine.outputs import Delta, RequestFailedError, TokenLogprob, Usage
from inference.engine.sampler import Sampler

logger = logging.getLogger(__name__)

# Disk-tier blocks loaded per idle iteration of the engine loop after a start.
WARM_UP_BATCH_BLOCKS = 16

# Called on the engine thread with each Delta, then the Usage, or a RequestFailedError instead.
OutputCallback = Callable[[Delta | Usage | BaseException], None]


@dataclass(slots=True, eq=False)
class Request:
    seq: Sequence
    detokenizer: IncrementalDetokenizer
    on_output: OutputCallback | None
    # The engine's own work (a passage computed for chunk-KV reuse): no user waits on it, so
    # it stays out of the latency and request metrics.
    is_internal: bool = False


class EngineCore:
    def __init__(
        self,
        config: EngineConfig,
        runner: ModelRunner,
        *,
        max_model_len: int,
        eos_token_ids: frozenset[int],
        on_request_done: Callable[[str], None],
        draft_runner: ModelRunner | None = None,
    ) -> None:
        self.runner = runner
        self.max_model_len = max_model_len
        self.eos_token_ids = eos_token_ids
        self.on_request_done = on_request_done
        chunk_reuse_recompute_tokens = _chunk_reuse_recompute_tokens(config, runner)
        self.disk_cache = _open_disk_cache(
            config, runner, blends=chunk_reuse_recompute_tokens is not None
        )
        self.block_manager = BlockManager(
            runner.num_kv_blocks,
            config.block_size,
            enable_prefix_caching=config.enable_prefix_caching,
            disk_cache=self.disk_cache,
        )
        self.scheduler = Scheduler(
            self.block_manager,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            chunk_reuse_recompute_tokens=chunk_reuse_recompute_tokens,
            chunk_reuse_by_deviation=chunk_reuse_recompute_tokens is not None
            and _chunk_reuse_by_deviation(config, runner),
        )
        self.sampler = Sampler()
        self.proposer: NgramProposer | None = None
        self.draft_proposer: DraftProposer | None = None
        if config.uses_draft_model:
            if draft_runner is None:
                raise ConfigError("speculative_method 'draft' needs the draft model's runner")
            self.draft_proposer = DraftProposer(
                draft_runner,
                config.num_speculative_tokens,
                enable_prefix_caching=config.enable_prefix_caching,
                max_num_catch_up_tokens=config.max_num_batched_tokens,
            )
        elif config.num_speculative_tokens:
            self.proposer = NgramProposer(
                config.num_speculative_tokens,
                min_n=config.speculative_ngram_min,
                max_n=config.speculative_ngram_max,
            )
        self.speculative_max_num_seqs = config.speculative_max_num_seqs
        self.metrics = EngineMetrics()
        if self.disk_cache is not None:
            self.metrics.watch_disk_cache(self.disk_cache)
        self.requests: dict[str, Request] = {}
        self._last_output: SchedulerOutput | None = None

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    @property
    def is_warming_up(self) -> bool:
        """Whether blocks of the disk tier are still to be loaded while idle (`warm_up`)."""
        return self.block_manager.is_warming_up

    def warm_up(self) -> None:
        """Load a few of the disk tier's most recent blocks (a batch short enough that a request
        arriving meanwhile waits for it unnoticed: ~10 ms)."""
        try:
            self.block_manager.warm_up(WARM_UP_BATCH_BLOCKS)
        except Exception:
            # NOTE: a cache is never worth failing requests for: warming up stops, blocks are
            # still read on demand.
            logger.exception("warming the prefix cache up from disk failed; stopping it")
            self.block_manager.warm_up_hashes.clear()

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

    def close(self) -> None:
        """Abort every request and write the disk tier's queued blocks (the engine stops)."""
        self.abort_all()
        if self.disk_cache is not None:
            self.disk_cache.close()

    def step(self) -> bool:
        """One iteration: schedule, run the model, sample, deliver. False if nothing could run."""
        if self.proposer is not None or self.draft_proposer is not None:
            self._propose_drafts()
        output = self._last_output = self.scheduler.schedule()
        num_generated = 0
        if not output.is_empty:
            sampled_seqs, token_ids, logprobs = self._execute(output)
            num_generated = self._postprocess(output, sampled_seqs, token_ids, logprobs)
        self._last_output = None
        self.record_metrics(output, num_generated=num_generated)
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

    def _propose_drafts(self) -> None:
        """Give each decoding sequence its drafts for this step (none when the batch is big)."""
        running = self.scheduler.running
        decodes = [seq for seq in running if seq.num_uncomputed_tokens == 1 and _may_draft(seq)]
        for seq in running:
            seq.draft_token_ids = []
        if self.draft_proposer is not None:
            self.draft_proposer.keep_only(running)  # frees what preempted sequences held
        if len(decodes) > self.speculative_max_num_seqs:
            return
        # NOTE: the step samples one token anyway; drafts beyond the request's remaining tokens
        # could never be used.
        limits = [self._num_tokens_left(seq) - 1 for seq in decodes]
        if self.draft_proposer is not None:
            drafts = self.draft_proposer.propose(decodes, limits)
        elif self.proposer is not None:
            ngram = self.proposer
            drafts = [ngram.propose(s.token_ids, n) for s, n in zip(decodes, limits, strict=True)]
        else:
            return
        for seq, seq_drafts in zip(decodes, drafts, strict=True):
            seq.draft_token_ids = seq_drafts

    def _num_tokens_left(self, seq: Sequence) -> int:
        num_left = self.max_model_len - seq.num_tokens
        if seq.params.max_tokens is not None:
            num_left = min(num_left, seq.params.max_tokens - seq.num_completion_tokens)
        return num_left

    def _execute(
        self, output: SchedulerOutput
    ) -> tuple[list[Sequence], list[list[int]], dict[str, TokenLogprob]]:
        """Run the step; return the sequences that sample, the tokens picked for each, and the
        picks' logprobs by request id (for the requests that asked).

        A sequence with drafts gets a pick per draft position plus one (see the module notes).
        """
        entries, sample_rows = [], []
        for row, (seq, num_tokens) in enumerate(
            zip(output.seqs, output.num_scheduled_tokens, strict=True)
        ):
            if seq.blend is not None:
                entries.append(self._blended_entry(seq))
                sample_rows.append(row)  # NOTE: a blend computes the prompt's last token
                continue
            start = seq.num_computed_tokens
            num_known = num_tokens - len(seq.draft_token_ids)
            token_ids = seq.token_ids[start : start + num_known]
            if seq.draft_token_ids:
                token_ids += seq.draft_token_ids
            num_logits = 1 + len(seq.draft_token_ids)
            entries.append(BatchEntry(token_ids, start, seq.block_table, num_logits))
            if start + num_known == seq.num_tokens:
                sample_rows.append(row)
        logits = self.runner.execute(entries)
        if not sample_rows:
            return [], [], {}
        logits_per_seq = [entries[row].num_logits for row in sample_rows]
        if len(sample_rows) < len(entries):
            first_logit = list(itertools.accumulate((e.num_logits for e in entries), initial=0))
            rows = [r for row in sample_rows for r in range(first_logit[row], first_logit[row + 1])]
            logits = logits[torch.tensor(rows)]
        sampled_seqs = [output.seqs[row] for row in sample_rows]
        # NOTE: before sampling, which masks a grammar's forbidden tokens in place.
        log_probs = self._log_softmax_rows(logits, sampled_seqs, logits_per_seq)
        if len(logits) == len(sampled_seqs):
            picks = [[token] for token in self.sampler(logits, sampled_seqs)]
        else:
            flat = iter(self.sampler(logits, sampled_seqs, logits_per_seq))
            picks = [list(itertools.islice(flat, n)) for n in logits_per_seq]
        if log_probs is None:
            return sampled_seqs, picks, {}
        return sampled_seqs, picks, token_logprobs(log_probs, sampled_seqs, picks)

    def _blended_entry(self, seq: Sequence) -> BatchEntry:
        """Copy the reused passages' keys/values into `seq`'s blocks; the entry computing the
        rest of its prompt (core/chunk_reuse.py)."""
        plan = seq.blend
        assert plan is not None
        try:
            self.runner.copy_reused_kv(seq.block_table, plan.runs)
        finally:
            release(self.block_manager, plan)
        positions = plan.query_positions
        if plan.num_selected:
            positions = self._select_by_deviation(seq, plan)
        token_ids = [seq.token_ids[p] for p in positions]
        return BatchEntry(token_ids, positions[0], seq.block_table, positions=positions)

    def _select_by_deviation(self, seq: Sequence, plan: BlendPlan) -> list[int]:
        """The blend's query positions plus the `plan.num_selected` reused positions whose
        keys/values the prompt's context moves most (ModelRunner.kv_deviation, which also
        leaves the probed layers' keys/values exact for every position)."""
        reused = sorted(p for run in plan.runs for p in run.target_positions)
        # NOTE: reused and query positions together are every position after the cache hit
        probed = range(min(reused[0], plan.query_positions[0]), seq.num_tokens)
        deviation = self.runner.kv_deviation(
            seq.block_table, list(probed), seq.token_ids[probed.start :]
        )
        reused_deviation = deviation[torch.tensor(reused) - probed.start]
        chosen = torch.topk(reused_deviation, plan.num_selected).indices.tolist()
        return sorted([*plan.query_positions, *(reused[i] for i in chosen)])

    def _log_softmax_rows(
        self, logits: torch.Tensor, seqs: list[Sequence], logits_per_seq: list[int]
    ) -> dict[int, torch.Tensor] | None:
        """The model's log-probabilities at the rows of sequences that asked for logprobs (each
        has one row: it gets no drafts), by index into `seqs`."""
        wanted = [i for i, seq in enumerate(seqs) if seq.params.logprobs is not None]
        if not wanted:
            return None
        first_rows = list(itertools.accumulate(logits_per_seq, initial=0))
        rows = torch.tensor([first_rows[i] for i in wanted], device=logits.device)
        log_probs = torch.log_softmax(logits[rows].float(), dim=-1)
        return dict(zip(wanted, log_probs, strict=True))

    def _postprocess(
        self,
        output: SchedulerOutput,
        sampled_seqs: list[Sequence],
        picks: list[list[int]],
        logprobs: dict[str, TokenLogprob],
    ) -> int:
        """Append each sequence's accepted tokens; return how many were appended for requests
        (the engine's own passage requests are not counted: nobody reads their tokens)."""
        now = time.monotonic()
        self.scheduler.update_from_output(output)
        num_appended = num_verified = num_drafted = num_accepted_total = 0
        for seq, token_ids in zip(sampled_seqs, picks, strict=True):
            drafts, seq.draft_token_ids = seq.draft_token_ids, []
            num_accepted = 0
            while num_accepted < len(drafts) and drafts[num_accepted] == token_ids[num_accepted]:
                num_accepted += 1
            if drafts:
                num_verified += 1
                num_drafted += len(drafts)
                num_accepted_total += num_accepted
            request = self.requests[seq.request_id]
            logprob = logprobs.get(seq.request_id)
            for token_id in token_ids[: num_accepted + 1]:
                num_appended += not request.is_internal
                if self._process_token(request, token_id, now, logprob):
                    break  # a stop condition (or an abort): nothing after it counts
            else:
                self.scheduler.accept_draft_tokens(seq, num_accepted)
        if num_verified:
            self.metrics.record_speculation(num_verified, num_drafted, num_accepted_total)
        return num_appended

    def _process_token(
        self, request: Request, token_id: int, now: float, logprob: TokenLogprob | None = None
    ) -> bool:
        """Append one token, deliver its text; True when the request has finished."""
        seq, params, detokenizer = request.seq, request.seq.params, request.detokenizer
        previous_token_time = seq.last_token_time
        seq.append_token(token_id, now)
        if request.is_internal:
            pass
        elif previous_token_time is None:
            self.metrics.record_first_token(
                now - seq.arrival_time,
                seq.num_prompt_tokens,
                seq.num_cached_tokens,
                seq.num_reused_tokens,
            )
        else:
            self.metrics.record_inter_token_latency(now - previous_token_time)

        finish_reason = None
        is_grammar_done = seq.grammar is not None and self._advance_grammar(seq, token_id)
        if (
            is_grammar_done
            or token_id in params.stop_token_ids
            or (not params.ignore_eos and token_id in self.eos_token_ids)
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
        logprobs = (logprob,) if logprob is not None else ()
        if finish_reason is None:
            self._deliver(request, Delta(seq.request_id, text, (token_id,), None, logprobs))
            return seq.is_finished  # its consumer may have failed and aborted it
        self.scheduler.finish(seq, finish_reason)
        reason = finish_reason.value
        self._deliver(request, Delta(seq.request_id, text, (token_id,), reason, logprobs))
        self._complete(request, reason)
        return True

    def _advance_grammar(self, seq: Sequence, token_id: int) -> bool:
        """Move a constrained sequence's grammar past `token_id`; True when it must end there."""
        assert seq.grammar is not None
        if seq.grammar.accept(token_id):
            return seq.grammar.is_terminated
        # NOTE: cannot happen (the sampler masked every forbidden token); if it did, the output
        # would no longer be valid, so it ends here rather than going on.
        logger.error("%s: token %d broke its grammar", seq.request_id, token_id)
        return True

    def _complete(
        self, request: Request, finish_reason: str, error: BaseException | None = None
    ) -> None:
        request_id = request.seq.request_id
        if self.requests.pop(request_id, None) is None:
            return  # already completed (its consumer failed while receiving the last delta)
        if self.draft_proposer is not None:
            self.draft_proposer.release(request_id)
        self.on_request_done(request_id)
        if not request.is_internal:
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


def _may_draft(seq: Sequence) -> bool:
    """Speculation skips sequences that need per-position state at every draft: a grammar (its
    state at each draft, and a rollback after a rejection) or logprobs (one row per token)."""
    return seq.grammar is None and seq.params.logprobs is None


def token_logprobs(
    log_probs: dict[int, torch.Tensor], seqs: list[Sequence], picks: list[list[int]]
) -> dict[str, TokenLogprob]:
    """Each picked token's log-probability and its row's top tokens, by request id."""
    result = {}
    for index, row in log_probs.items():
        seq, [token_id] = seqs[index], picks[index]
        num_top = seq.params.logprobs or 0
        top: tuple[tuple[int, float], ...] = ()
        if num_top:
            values, ids = row.topk(num_top)
            top = tuple(zip(ids.tolist(), values.tolist(), strict=True))
        result[seq.request_id] = TokenLogprob(token_id, float(row[token_id]), top)
    return result


def _chunk_reuse_recompute_tokens(config: EngineConfig, runner: ModelRunner) -> int | None:
    """The scheduler's chunk-KV reuse setting: None (off) where it cannot run here."""
    if not config.chunk_kv_reuse:
        return None
    reason = runner.cannot_reuse_kv_reason()
    if reason is None and not config.enable_prefix_caching:
        reason = "prefix caching is off (passages are found in the prefix cache)"
    if reason is not None:
        logger.warning("chunk-KV reuse is off: %s", reason)
        return None
    return config.chunk_kv_recompute_tokens


def _chunk_reuse_by_deviation(config: EngineConfig, runner: ModelRunner) -> bool:
    """Whether blends choose their recomputed tokens by deviation (else their leading ones)."""
    if config.chunk_kv_selection != "deviation":
        return False
    if not runner.can_probe_kv():
        logger.info("chunk-KV reuse recomputes each passage's leading tokens: no layer probe")
        return False
    return True


def _open_disk_cache(
    config: EngineConfig, runner: ModelRunner, *, blends: bool
) -> KVDiskCache | None:
    """The prefix cache's disk tier, when configured; None (memory only) when it cannot open.
    `blends`: chunk-KV reuse is on (its blocks go to a directory of their own)."""
    if config.kv_disk_cache_dir is None or not config.enable_prefix_caching:
        return None
    fingerprint = kv_fingerprint(
        Path(config.model_dir),
        dtype=runner.dtype,
        quantization=config.quantization,
        quantization_group_size=config.quantization_group_size,
        kv_cache_dtype=config.kv_cache_dtype,
        block_size=config.block_size,
        device=runner.device,
        chunk_kv_reuse=blends,
    )
    try:
        return KVDiskCache(
            Path(config.kv_disk_cache_dir),
            fingerprint,
            runner.kv_cache,
            max_bytes=config.kv_disk_cache_bytes,
        )
    except OSError as error:
        # NOTE: a cache is never worth refusing to serve for.
        logger.warning(
            "KV disk cache at %s unavailable (%s); prefix caching stays in memory",
            config.kv_disk_cache_dir,
            error,
        )
        return None
