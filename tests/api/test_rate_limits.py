"""api.rate_limits: per-key requests and tokens per minute, in process and on Redis.

The in-process store runs in every pass; the Redis store in the integration pass (REDIS_URL set),
where several processes share the counters.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from django.conf import settings as django_settings

from api import rate_limits
from api.models import ApiKey
from api.rate_limits import InProcessStore, Limiter, RateLimited, RedisStore

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
# A fixed instant 45.25 s into a window, so no test can straddle a window's end.
T0 = 1_800_000_000.0 - (1_800_000_000.0 % 60) + 45.25


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def redis_url() -> str:
    if not django_settings.REDIS_URL:
        pytest.skip("runs in the integration pass (REDIS_URL=redis://...)")
    return django_settings.REDIS_URL


def forget_redis_counters(url: str, key_ids: list[str]) -> None:
    client = RedisStore(url).client
    for key_id in key_ids:
        for name in client.scan_iter(f"cachet:rl:{key_id}:*"):
            client.delete(name)


@pytest.fixture(params=["in_process", pytest.param("redis", marks=pytest.mark.integration)])
def store(request):
    if request.param == "in_process":
        return InProcessStore()
    return RedisStore(redis_url())


@pytest.fixture
def unique_id() -> str:
    """A key id no earlier run has used, so counters left in Redis never leak in."""
    return f"test-{os.getpid()}-{time.time_ns()}"


@pytest.fixture(params=["in_process", pytest.param("redis", marks=pytest.mark.integration)])
def backend(request, settings) -> None:
    """Point the module's per-process limiter at one backend (through the REDIS_URL setting)."""
    settings.REDIS_URL = None if request.param == "in_process" else redis_url()


@pytest.fixture
def fresh_counters():
    """The module's per-process limiter without counters from earlier tests."""
    rate_limits.reset()
    yield
    rate_limits.reset()


def wait_for_a_fresh_window(margin_s: float = 3.0) -> None:
    """Tests on the real clock: do not start within `margin_s` of a window's end."""
    left = 60 - time.time() % 60
    if left < margin_s:
        time.sleep(left + 0.05)


def test_the_request_after_the_limit_is_refused_until_the_window_ends(store, unique_id) -> None:
    clock = Clock()
    limiter = Limiter(store, clock=clock)
    for _ in range(3):
        limiter.check_request(unique_id, 3)
    with pytest.raises(RateLimited) as error:
        limiter.check_request(unique_id, 3)
    assert error.value.retry_after_s == 15  # 45.25 s into the window: 14.75 s left, rounded up
    assert error.value.kind == "requests"
    assert (error.value.limit, error.value.used) == (3, 3)
    assert "Rate limit reached for requests per minute (RPM)" in error.value.message
    assert "Please try again in 15s." in error.value.message
    clock.now += 15
    limiter.check_request(unique_id, 3)


def test_refused_requests_do_not_consume_budget(store, unique_id) -> None:
    clock = Clock()
    limiter = Limiter(store, clock=clock)
    for _ in range(2):
        limiter.check_request(unique_id, 2)
    for _ in range(10):
        with pytest.raises(RateLimited) as error:
            limiter.check_request(unique_id, 2)
        assert error.value.used == 2
    assert store.get(f"{unique_id}:requests", int(clock.now // 60)) == 2


def test_each_key_has_its_own_budget(store, unique_id) -> None:
    limiter = Limiter(store, clock=Clock())
    limiter.check_request(unique_id + "-a", 1)
    limiter.check_request(unique_id + "-b", 1)
    with pytest.raises(RateLimited):
        limiter.check_request(unique_id + "-a", 1)


@pytest.mark.parametrize(
    ("into_window", "retry_after"), [(0.0, 60), (0.5, 60), (30.0, 30), (59.01, 1), (59.999, 1)]
)
def test_retry_after_is_the_whole_seconds_left_in_the_window(into_window, retry_after) -> None:
    clock = Clock(T0 - 45.25 + into_window)
    limiter = Limiter(InProcessStore(), clock=clock)
    limiter.check_request("k", 1)
    with pytest.raises(RateLimited) as error:
        limiter.check_request("k", 1)
    assert error.value.retry_after_s == retry_after


def test_the_token_budget_refuses_once_spent_and_not_before(store, unique_id) -> None:
    clock = Clock()
    limiter = Limiter(store, clock=clock)
    limiter.check_tokens(unique_id, 100)
    limiter.charge_tokens(unique_id, 60)
    limiter.check_tokens(unique_id, 100)  # 40 left: a request may still start
    limiter.charge_tokens(unique_id, 60)  # it may end over budget; the next one waits
    with pytest.raises(RateLimited) as error:
        limiter.check_tokens(unique_id, 100)
    assert error.value.kind == "tokens"
    assert (error.value.limit, error.value.used) == (100, 120)
    assert "tokens per minute (TPM)" in error.value.message
    assert 1 <= error.value.retry_after_s <= 60
    limiter.check_request(unique_id, 1)  # requests and tokens are separate budgets
    clock.now += 60
    limiter.check_tokens(unique_id, 100)


def test_charging_no_tokens_changes_nothing_and_negative_counts_are_refused(store, unique_id):
    limiter = Limiter(store, clock=Clock())
    limiter.charge_tokens(unique_id, 0)
    assert store.get(f"{unique_id}:tokens", int(T0 // 60)) == 0
    with pytest.raises(ValueError):
        limiter.charge_tokens(unique_id, -5)


def test_the_limit_holds_when_twenty_threads_race_for_five_requests(store, unique_id) -> None:
    limiter = Limiter(store, clock=Clock())
    passed: list[int] = []
    refused: list[int] = []
    start = threading.Barrier(20)

    def hit() -> None:
        start.wait()
        try:
            limiter.check_request(unique_id, 5)
            passed.append(1)
        except RateLimited:
            refused.append(1)

    threads = [threading.Thread(target=hit) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert (len(passed), len(refused)) == (5, 15)


def test_in_process_counters_of_past_windows_are_dropped() -> None:
    clock = Clock()
    store = InProcessStore()
    limiter = Limiter(store, clock=clock)
    for n in range(50):
        limiter.check_request(f"key-{n}", 5)
        limiter.charge_tokens(f"key-{n}", 10)
    assert len(store) == 100
    clock.now += 60
    limiter.check_request("key-0", 5)
    assert len(store) == 1


def test_public_functions_apply_the_keys_own_limits(user, backend, fresh_counters) -> None:
    api_key, _ = ApiKey.create_for(user, "small", requests_per_minute=5, tokens_per_minute=50)
    other, _ = ApiKey.create_for(user, "other", requests_per_minute=5)
    wait_for_a_fresh_window()
    passed = 0
    lock = threading.Lock()
    start = threading.Barrier(20)

    def hit() -> None:
        nonlocal passed
        start.wait()
        try:
            rate_limits.check_request(api_key)
        except RateLimited:
            return
        with lock:
            passed += 1

    threads = [threading.Thread(target=hit) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert passed == 5
    rate_limits.check_request(other)
    with pytest.raises(RateLimited) as error:
        rate_limits.check_request(api_key)
    assert 1 <= error.value.retry_after_s <= 60
    assert f"on API key '{api_key.prefix}…'" in error.value.message
    rate_limits.check_tokens(api_key)
    rate_limits.charge_tokens(api_key, 50)
    with pytest.raises(RateLimited):
        rate_limits.check_tokens(api_key)
    rate_limits.check_tokens(other)


def test_keys_without_limits_use_the_configured_defaults(user, settings, fresh_counters) -> None:
    settings.REDIS_URL = None
    settings.CACHET_API_REQUESTS_PER_MINUTE = 2
    settings.CACHET_API_TOKENS_PER_MINUTE = 10
    api_key, _ = ApiKey.create_for(user, "defaults")
    wait_for_a_fresh_window()
    rate_limits.check_request(api_key)
    rate_limits.check_request(api_key)
    with pytest.raises(RateLimited):
        rate_limits.check_request(api_key)
    rate_limits.charge_tokens(api_key, 10)
    with pytest.raises(RateLimited):
        rate_limits.check_tokens(api_key)


async def test_the_async_wrappers_count_like_the_functions(user, backend, fresh_counters):
    api_key = ApiKey(user=user, name="async", requests_per_minute=1, tokens_per_minute=5)
    api_key.set_new_key()  # never saved: the limiter only needs the key's hash and limits
    wait_for_a_fresh_window()
    await rate_limits.acheck_request(api_key)
    with pytest.raises(RateLimited):
        await rate_limits.acheck_request(api_key)
    await rate_limits.acheck_tokens(api_key)
    await rate_limits.acharge_tokens(api_key, 5)
    with pytest.raises(RateLimited):
        await rate_limits.acheck_tokens(api_key)


def test_an_unreachable_redis_fails_open_with_one_warning(user, settings, caplog) -> None:
    # NOTE: port 1 on loopback: nothing listens there, so the connection is refused at once.
    settings.REDIS_URL = "redis://127.0.0.1:1/9"  # a URL no other test's limiter has warned for
    api_key, _ = ApiKey.create_for(user, "outage", requests_per_minute=1, tokens_per_minute=1)
    with caplog.at_level(logging.WARNING, logger="api.rate_limits"):
        for _ in range(5):
            rate_limits.check_request(api_key)
            rate_limits.check_tokens(api_key)
            rate_limits.charge_tokens(api_key, 100)
    warnings = [r for r in caplog.records if r.name == "api.rate_limits"]
    assert len(warnings) == 1
    assert "rate limits not enforced" in warnings[0].getMessage()


def test_the_limiter_is_made_once_per_process_for_the_configured_backend(settings) -> None:
    settings.REDIS_URL = None
    first = rate_limits.get_limiter()
    assert rate_limits.get_limiter() is first
    assert isinstance(first.store, InProcessStore)
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    assert isinstance(rate_limits.get_limiter().store, RedisStore)


@pytest.mark.integration
def test_redis_counters_are_named_per_key_kind_and_window_and_expire(unique_id) -> None:
    url = redis_url()
    store = RedisStore(url)
    limiter = Limiter(store, clock=Clock())
    limiter.check_request(unique_id, 5)
    limiter.charge_tokens(unique_id, 7)
    window = int(T0 // 60)
    client = store.client
    assert int(client.get(f"cachet:rl:{unique_id}:requests:{window}")) == 1
    assert int(client.get(f"cachet:rl:{unique_id}:tokens:{window}")) == 7
    assert 0 < client.ttl(f"cachet:rl:{unique_id}:requests:{window}") <= 120
    assert 0 < client.ttl(f"cachet:rl:{unique_id}:tokens:{window}") <= 120
    forget_redis_counters(url, [unique_id])


# Run in separate interpreters: each makes its own limiter and Redis connection, as server
# processes do, and they all start together.
PROCESS_SCRIPT = """
import json, sys, time
from api.rate_limits import Limiter, RateLimited, RedisStore
url, key_id, start_at = sys.argv[1], sys.argv[2], float(sys.argv[3])
limiter = Limiter(RedisStore(url), clock=lambda: 1_800_000_000.0)
while time.time() < start_at:
    time.sleep(0.001)
passed = 0
for _ in range(10):
    try:
        limiter.check_request(key_id, 7)
        passed += 1
    except RateLimited:
        pass
print(json.dumps(passed))
"""


@pytest.mark.integration
def test_the_limit_holds_across_processes_sharing_redis(unique_id) -> None:
    url = redis_url()
    start_at = time.time() + 3.0
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", PROCESS_SCRIPT, url, unique_id, str(start_at)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    results = []
    for worker in workers:
        out, err = worker.communicate(timeout=60)
        assert worker.returncode == 0, err
        results.append(json.loads(out))
    assert sum(results) == 7  # 40 attempts from 4 processes, a limit of 7
    forget_redis_counters(url, [unique_id])


@pytest.mark.django_db(transaction=True)
async def test_the_limit_holds_for_concurrent_http_requests(user, backend, fresh_counters):
    from asgiref.sync import sync_to_async
    from django.test import AsyncClient

    _, key = await sync_to_async(ApiKey.create_for)(user, "burst", requests_per_minute=5)
    client, headers = AsyncClient(), {"Authorization": f"Bearer {key}"}
    wait_for_a_fresh_window()
    responses = await asyncio.gather(
        *(client.get("/v1/documents", headers=headers) for _ in range(20))
    )
    statuses = sorted(response.status_code for response in responses)
    assert statuses == [200] * 5 + [429] * 15
    refused = [r for r in responses if r.status_code == 429]
    assert all(1 <= int(r["Retry-After"]) <= 60 for r in refused)
    assert {r.json()["error"]["code"] for r in refused} == {"rate_limit_exceeded"}
