"""EngineMetrics: Prometheus metrics for one engine, in the engine's own CollectorRegistry.

The Django side exposes `metrics.registry` at /metrics (`prometheus_client.generate_latest`) and
shows `snapshot()` in the UI. Recording is a handful of counter/gauge updates per step so the
engine thread stays cheap; ratios and rates are computed only when a snapshot is asked for.
"""

from __future__ import annotations

import functools
import time
from collections import deque
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

if TYPE_CHECKING:
    from inference.engine.kv_disk_cache import KVDiskCache

PREFIX = "cachet_engine"
TTFT_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 60.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
# NOTE: tokens/s in snapshots is over this recent window, so it shows the current load.
THROUGHPUT_WINDOW_S = 10.0
FINISH_REASONS = ("stop", "length", "abort", "error")


class EngineMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.num_running = Gauge(f"{PREFIX}_requests_running", "Requests in the batch", registry=r)
        self.num_waiting = Gauge(f"{PREFIX}_requests_waiting", "Requests queued", registry=r)
        self.kv_usage = Gauge(
            f"{PREFIX}_kv_cache_usage_ratio", "Fraction of KV blocks held by requests", registry=r
        )
        self.prompt_tokens = Counter(f"{PREFIX}_prompt_tokens", "Prompt tokens", registry=r)
        self.cached_tokens = Counter(
            f"{PREFIX}_cached_prompt_tokens", "Prompt tokens served by the prefix cache", registry=r
        )
        self.reused_tokens = Counter(
            f"{PREFIX}_reused_prompt_tokens",
            "Prompt tokens copied from passages computed on their own (chunk-KV reuse)",
            registry=r,
        )
        self.generation_tokens = Counter(
            f"{PREFIX}_generation_tokens", "Generated tokens", registry=r
        )
        self.preemptions = Counter(
            f"{PREFIX}_preemptions", "Requests preempted for KV blocks", registry=r
        )
        self.requests = Counter(
            f"{PREFIX}_requests", "Finished requests", ["finish_reason"], registry=r
        )
        self.spec_verifications = Counter(
            f"{PREFIX}_spec_decode_verifications",
            "Sequence steps that verified speculative draft tokens",
            registry=r,
        )
        self.spec_draft_tokens = Counter(
            f"{PREFIX}_spec_decode_draft_tokens", "Speculative draft tokens verified", registry=r
        )
        self.spec_accepted_tokens = Counter(
            f"{PREFIX}_spec_decode_accepted_tokens",
            "Speculative draft tokens accepted (equal to the sampled token)",
            registry=r,
        )
        self.ttft = Histogram(
            f"{PREFIX}_time_to_first_token_seconds", "TTFT", buckets=TTFT_BUCKETS, registry=r
        )
        self.itl = Histogram(
            f"{PREFIX}_inter_token_latency_seconds", "ITL", buckets=ITL_BUCKETS, registry=r
        )
        self._requests_by_reason = {
            reason: self.requests.labels(reason) for reason in FINISH_REASONS
        }
        self._recent_tokens: deque[tuple[float, int]] = deque()

    def watch_disk_cache(self, disk_cache: KVDiskCache) -> None:
        """Export the prefix cache's disk tier: its counters are read when metrics are read."""
        r = self.registry
        for name, help_text, read in (
            ("blocks_loaded", "KV blocks read back from the disk tier", "num_loaded"),
            ("blocks_written", "KV blocks written to the disk tier", "num_written"),
            ("blocks_rejected", "Disk-tier files ignored (corrupt, foreign)", "num_rejected"),
            ("blocks_dropped", "KV blocks not written: the writer was busy", "num_dropped"),
            ("bytes", "Bytes of the disk tier's files", "num_bytes"),
        ):
            gauge = Gauge(f"{PREFIX}_kv_disk_{name}", help_text, registry=r)
            gauge.set_function(functools.partial(_read_number, disk_cache, read))
        writing = Gauge(
            f"{PREFIX}_kv_disk_writes_enabled", "1 while the disk tier writes", registry=r
        )
        writing.set_function(lambda: float(disk_cache.writes_enabled))

    def record_step(
        self,
        *,
        num_running: int,
        num_waiting: int,
        kv_usage: float,
        num_preempted: int = 0,
        num_generated: int = 0,
        now: float | None = None,
    ) -> None:
        self.num_running.set(num_running)
        self.num_waiting.set(num_waiting)
        self.kv_usage.set(kv_usage)
        if num_preempted:
            self.preemptions.inc(num_preempted)
        if num_generated:
            now = time.monotonic() if now is None else now
            self.generation_tokens.inc(num_generated)
            self._recent_tokens.append((now, num_generated))
            while self._recent_tokens[0][0] < now - THROUGHPUT_WINDOW_S:
                self._recent_tokens.popleft()

    def record_first_token(
        self, ttft_s: float, num_prompt_tokens: int, num_cached: int, num_reused: int = 0
    ) -> None:
        self.ttft.observe(ttft_s)
        self.prompt_tokens.inc(num_prompt_tokens)
        if num_cached:
            self.cached_tokens.inc(num_cached)
        if num_reused:
            self.reused_tokens.inc(num_reused)

    def record_inter_token_latency(self, seconds: float) -> None:
        self.itl.observe(seconds)

    def record_speculation(self, num_verified: int, num_drafted: int, num_accepted: int) -> None:
        """One step's speculative verification: sequences, draft tokens, accepted drafts."""
        self.spec_verifications.inc(num_verified)
        self.spec_draft_tokens.inc(num_drafted)
        self.spec_accepted_tokens.inc(num_accepted)

    def record_finished(self, finish_reason: str) -> None:
        self._requests_by_reason[finish_reason].inc()

    def snapshot(self) -> dict[str, object]:
        """Current values as plain numbers (safe to call from any thread)."""
        value = self.registry.get_sample_value
        prompt_tokens = value(f"{PREFIX}_prompt_tokens_total") or 0.0
        cached_tokens = value(f"{PREFIX}_cached_prompt_tokens_total") or 0.0
        ttft_count = value(f"{PREFIX}_time_to_first_token_seconds_count") or 0.0
        itl_count = value(f"{PREFIX}_inter_token_latency_seconds_count") or 0.0
        finished = {
            reason: int(value(f"{PREFIX}_requests_total", {"finish_reason": reason}) or 0)
            for reason in FINISH_REASONS
        }
        verifications = value(f"{PREFIX}_spec_decode_verifications_total") or 0.0
        draft_tokens = value(f"{PREFIX}_spec_decode_draft_tokens_total") or 0.0
        accepted_tokens = value(f"{PREFIX}_spec_decode_accepted_tokens_total") or 0.0
        return {
            "num_running": int(value(f"{PREFIX}_requests_running") or 0),
            "num_waiting": int(value(f"{PREFIX}_requests_waiting") or 0),
            "kv_usage": value(f"{PREFIX}_kv_cache_usage_ratio") or 0.0,
            "prompt_tokens": int(prompt_tokens),
            "cached_prompt_tokens": int(cached_tokens),
            "reused_prompt_tokens": int(value(f"{PREFIX}_reused_prompt_tokens_total") or 0),
            "prefix_cache_hit_rate": cached_tokens / prompt_tokens if prompt_tokens else 0.0,
            "generation_tokens": int(value(f"{PREFIX}_generation_tokens_total") or 0),
            "tokens_per_s": self._recent_tokens_per_s(),
            "num_preemptions": int(value(f"{PREFIX}_preemptions_total") or 0),
            "num_requests": sum(finished.values()),
            "num_requests_by_finish_reason": finished,
            "ttft_mean_s": _mean(value(f"{PREFIX}_time_to_first_token_seconds_sum"), ttft_count),
            "itl_mean_s": _mean(value(f"{PREFIX}_inter_token_latency_seconds_sum"), itl_count),
            "kv_disk_blocks_loaded": int(value(f"{PREFIX}_kv_disk_blocks_loaded") or 0),
            "kv_disk_blocks_written": int(value(f"{PREFIX}_kv_disk_blocks_written") or 0),
            "spec_draft_tokens": int(draft_tokens),
            "spec_accepted_tokens": int(accepted_tokens),
            "spec_acceptance_rate": _mean(accepted_tokens, draft_tokens),
            # tokens a verifying sequence gains per step: its accepted drafts plus the sampled one
            "spec_tokens_per_verification": (
                1.0 + accepted_tokens / verifications if verifications else 0.0
            ),
        }

    def _recent_tokens_per_s(self) -> float:
        # NOTE: tuple() copies the deque atomically under the GIL while the engine appends.
        recent = tuple(self._recent_tokens)
        now = time.monotonic()
        num_tokens = sum(n for t, n in recent if t >= now - THROUGHPUT_WINDOW_S)
        return num_tokens / THROUGHPUT_WINDOW_S


def _mean(total: float | None, count: float) -> float:
    return (total or 0.0) / count if count else 0.0


def _read_number(source: object, attribute: str) -> float:
    return float(getattr(source, attribute))
