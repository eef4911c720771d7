"""Per-key limits on requests and tokens per minute, in fixed one-minute windows.

With `REDIS_URL` set the counters live in Redis, so every server process shares them and a check
is one atomic script (no read-then-write race between processes); without it they live in this
process, behind a lock. Counters are keyed `cachet:rl:<key id>:<requests|tokens>:<window>`, where
the window is the Unix minute and the key id the first 16 hex digits of the key's hash (not its
primary key: a recreated database, or a rolled-back test, hands the same pk out again and would
inherit the old key's counters).

How an API request uses this:
- `check_request(api_key)` before anything else: counts the request, or raises `RateLimited`
  when the window's request budget is spent (a refused request costs nothing);
- `check_tokens(api_key)` before running the model: raises `RateLimited` when the window's token
  budget is already spent (a request is not refused for tokens it has yet to use);
- `charge_tokens(api_key, prompt + completion)` after it: counts the tokens it used.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from asgiref.sync import sync_to_async

if TYPE_CHECKING:
    from api.models import ApiKey

__all__ = [
    "InProcessStore",
    "Limiter",
    "RateLimited",
    "RedisStore",
    "acharge_tokens",
    "acheck_request",
    "acheck_tokens",
    "charge_tokens",
    "check_request",
    "check_tokens",
    "get_limiter",
    "reset",
]

log = logging.getLogger(__name__)

WINDOW_S = 60
# Redis counters outlive their window a little, then expire on their own.
COUNTER_TTL_S = 2 * WINDOW_S
KEY_NAMESPACE = "cachet:rl"
REQUESTS = "requests"
TOKENS = "tokens"
KIND_LABELS = {REQUESTS: "requests per minute (RPM)", TOKENS: "tokens per minute (TPM)"}
# While Redis is down, warn at most this often per process instead of on every request.
OUTAGE_WARNING_INTERVAL_S = 60.0


class RateLimited(Exception):
    """A key's budget for this minute is spent; the API answers 429 with `Retry-After`.

    `kind` is "requests" or "tokens" (OpenAI's error `type` for a 429); `limit` and `used` are
    the window's budget and what was counted against it.
    """

    def __init__(
        self,
        retry_after_s: int,
        message: str,
        *,
        kind: str = REQUESTS,
        limit: int = 0,
        used: int = 0,
    ) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.message = message
        self.kind = kind
        self.limit = limit
        self.used = used


class StoreUnavailable(Exception):
    """The shared counter store could not be reached."""


class CounterStore(Protocol):
    def take(self, name: str, window: int, limit: int) -> tuple[bool, int]:
        """Atomically: add 1 if the counter is under `limit`. Returns (added, counter after)."""

    def get(self, name: str, window: int) -> int: ...

    def add(self, name: str, window: int, amount: int) -> int: ...


class InProcessStore:
    """Counters in a dict behind a lock; counters of past windows are dropped as time moves on."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, int], int] = {}
        self._window = 0

    def _prune(self, window: int) -> None:
        # Called with the lock held. Keeps the current window (and a later one, for odd clocks).
        if window > self._window:
            self._window = window
            self._counts = {k: v for k, v in self._counts.items() if k[1] >= window}

    def take(self, name: str, window: int, limit: int) -> tuple[bool, int]:
        with self._lock:
            self._prune(window)
            used = self._counts.get((name, window), 0)
            if used >= limit:
                return False, used
            self._counts[(name, window)] = used + 1
            return True, used + 1

    def get(self, name: str, window: int) -> int:
        with self._lock:
            self._prune(window)
            return self._counts.get((name, window), 0)

    def add(self, name: str, window: int, amount: int) -> int:
        with self._lock:
            self._prune(window)
            total = self._counts.get((name, window), 0) + amount
            self._counts[(name, window)] = total
            return total

    def clear(self) -> None:
        with self._lock:
            self._counts.clear()

    def __len__(self) -> int:
        return len(self._counts)


# Check and count in one step on the server, so concurrent clients cannot both take the last slot.
TAKE_SCRIPT = """
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
if used >= tonumber(ARGV[1]) then
  return {0, used}
end
used = redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
return {1, used}
"""


class RedisStore:
    """Counters in Redis, shared by every process using the same server."""

    def __init__(self, url: str, *, timeout_s: float = 0.5) -> None:
        import redis

        self._errors = (redis.RedisError,)
        # NOTE: short timeouts: the limiter is on every API request's path, and a Redis outage
        # must cost a request half a second at most (then it fails open, see Limiter).
        self.client = redis.Redis.from_url(
            url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s
        )
        self._take = self.client.register_script(TAKE_SCRIPT)

    @staticmethod
    def key(name: str, window: int) -> str:
        return f"{KEY_NAMESPACE}:{name}:{window}"

    def take(self, name: str, window: int, limit: int) -> tuple[bool, int]:
        try:
            added, used = self._take(keys=[self.key(name, window)], args=[limit, COUNTER_TTL_S])
        except self._errors as error:
            raise StoreUnavailable(f"{type(error).__name__}: {error}") from error
        return bool(added), int(used)

    def get(self, name: str, window: int) -> int:
        try:
            value = self.client.get(self.key(name, window))
        except self._errors as error:
            raise StoreUnavailable(f"{type(error).__name__}: {error}") from error
        return int(value or 0)

    def add(self, name: str, window: int, amount: int) -> int:
        key = self.key(name, window)
        try:
            with self.client.pipeline(transaction=True) as pipe:
                total, _ = pipe.incrby(key, amount).expire(key, COUNTER_TTL_S).execute()
        except self._errors as error:
            raise StoreUnavailable(f"{type(error).__name__}: {error}") from error
        return int(total)


class Limiter:
    """Request and token budgets over a counter store, in fixed windows of `WINDOW_S` seconds.

    The functions below use one per process (`get_limiter`); tests may make their own with a
    fixed `clock`.
    """

    def __init__(self, store: CounterStore, *, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock
        self._last_outage_warning = -math.inf

    def _window(self) -> tuple[int, int]:
        """The current window and the whole seconds until it ends (1..WINDOW_S)."""
        now = self.clock()
        window = int(now // WINDOW_S)
        retry_after = math.ceil((window + 1) * WINDOW_S - now)
        return window, min(max(retry_after, 1), WINDOW_S)

    def check_request(self, key_id: str, limit: int, *, label: str = "") -> None:
        window, retry_after = self._window()
        try:
            allowed, used = self.store.take(f"{key_id}:{REQUESTS}", window, limit)
        except StoreUnavailable as error:
            self._fail_open(error)
            return
        if not allowed:
            raise self._limited(REQUESTS, limit, used, retry_after, label)

    def check_tokens(self, key_id: str, limit: int, *, label: str = "") -> None:
        window, retry_after = self._window()
        try:
            used = self.store.get(f"{key_id}:{TOKENS}", window)
        except StoreUnavailable as error:
            self._fail_open(error)
            return
        if used >= limit:
            raise self._limited(TOKENS, limit, used, retry_after, label)

    def charge_tokens(self, key_id: str, num_tokens: int) -> None:
        if num_tokens < 0:
            raise ValueError(f"num_tokens must not be negative; got {num_tokens}")
        if num_tokens == 0:
            return
        window, _ = self._window()
        try:
            self.store.add(f"{key_id}:{TOKENS}", window, num_tokens)
        except StoreUnavailable as error:
            self._fail_open(error)

    @staticmethod
    def _limited(kind: str, limit: int, used: int, retry_after: int, label: str) -> RateLimited:
        on_key = f" on API key {label}" if label else ""
        return RateLimited(
            retry_after,
            f"Rate limit reached for {KIND_LABELS[kind]}{on_key}: Limit {limit}, Used {used}. "
            f"Please try again in {retry_after}s.",
            kind=kind,
            limit=limit,
            used=used,
        )

    def _fail_open(self, error: StoreUnavailable) -> None:
        # NOTE: fail open on purpose. The limits protect the engine from one greedy client; a
        # Redis outage must not turn into an error for every API call (the engine's own queue
        # still bounds the load). The outage is logged, once a minute while it lasts.
        now = time.monotonic()
        if now - self._last_outage_warning >= OUTAGE_WARNING_INTERVAL_S:
            self._last_outage_warning = now
            log.warning("rate limits not enforced: the counter store is unreachable (%s)", error)


# One limiter per process, for the REDIS_URL it was made for (tests change the setting).
_limiter: Limiter | None = None
_limiter_url: str | None = None
_limiter_lock = threading.Lock()


def get_limiter() -> Limiter:
    """This process's limiter: on Redis when `REDIS_URL` is set, else in-process. Made lazily."""
    global _limiter, _limiter_url
    from django.conf import settings

    url = settings.REDIS_URL
    limiter = _limiter
    if limiter is not None and _limiter_url == url:
        return limiter
    with _limiter_lock:
        if _limiter is None or _limiter_url != url:
            store = RedisStore(url) if url else InProcessStore()
            _limiter, _limiter_url = Limiter(store), url
        return _limiter


def reset() -> None:
    """Forget the in-process counters (for tests; counters in Redis are left alone)."""
    limiter = _limiter
    if limiter is not None and isinstance(limiter.store, InProcessStore):
        limiter.store.clear()


def key_id(api_key: ApiKey) -> str:
    return api_key.key_hash[:16]


def _label(api_key: ApiKey) -> str:
    return f"'{api_key.prefix}…'"


def check_request(api_key: ApiKey) -> None:
    """Count one request for `api_key`; raises `RateLimited` (not counted) when over its limit."""
    get_limiter().check_request(
        key_id(api_key), api_key.effective_requests_per_minute, label=_label(api_key)
    )


def check_tokens(api_key: ApiKey) -> None:
    """Raises `RateLimited` when `api_key` has already used its tokens for this minute."""
    get_limiter().check_tokens(
        key_id(api_key), api_key.effective_tokens_per_minute, label=_label(api_key)
    )


def charge_tokens(api_key: ApiKey, num_tokens: int) -> None:
    """Count tokens a finished request used (prompt + completion) against this minute's budget."""
    get_limiter().charge_tokens(key_id(api_key), num_tokens)


def _run_off_loop(function: Callable[..., None]) -> Callable[..., object]:
    async_function = sync_to_async(function, thread_sensitive=False)

    async def wrapper(*args, **kwargs) -> None:
        if isinstance(get_limiter().store, InProcessStore):
            # Microseconds under a lock: not worth a thread hop.
            return function(*args, **kwargs)
        # Redis is network I/O: keep it off the event loop. No database access, so any thread.
        return await async_function(*args, **kwargs)

    wrapper.__name__ = f"a{function.__name__}"
    wrapper.__doc__ = f"Async `{function.__name__}`."
    return wrapper


acheck_request = _run_off_loop(check_request)
acheck_tokens = _run_off_loop(check_tokens)
acharge_tokens = _run_off_loop(charge_tokens)
