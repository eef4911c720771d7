"""Disconnects: streaming clients that go away at random points; nothing may leak.

Starts a real server and sends `--clients` (100) streaming requests at once (each after a random
delay of up to `--spread` seconds): a seeded mix (`--api-share`) of raw `/v1/chat/completions`
SSE requests and `/ws/chat/` chat turns. Each client disconnects at a point drawn from the same
seeded RNG:

- `early`: right after sending the request (after 0-300 ms), whatever the server did so far;
- `before_first_token`: once the answer started (the SSE role chunk; the `start` frame) but before
  any text;
- `mid_stream`: after k text chunks, k drawn from 1..max_tokens/3 (answers often stop early);
- `after_end`: right after the last text (the chunk with the finish reason; `done`).

Half of the disconnects are abrupt (the TCP connection dropped, no goodbye), half polite (a
WebSocket close frame; closing the HTTP connection). Then the engine must become idle within
`--idle-timeout` seconds: nothing running or waiting and no KV block held (`/metrics`); and the
server must still answer a normal API request and a normal chat turn, with `/healthz` ok.

    python -m reliability.disconnects --json
    python -m reliability.disconnects --json --clients 20
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from harness import (
    CLOSED,
    CannotRunError,
    ChatSocket,
    LiveServer,
    LiveServerError,
    chat_exchange,
    default_models_dir,
    open_chat,
)
from harness.chat_socket import HOST
from reliability.common import (
    MAX_DETAILS,
    SYSTEM_PROMPT,
    Common,
    api_chat,
    api_client,
    check,
    config_report,
    engine_state,
    healthz,
    question,
    run_suite,
    server_report,
    start_server,
    suite_parser,
    wait_for_idle,
)

logger = logging.getLogger(__name__)

POINTS = ("early", "before_first_token", "mid_stream", "after_end")
CLIENT_TIMEOUT_S = 600.0
EARLY_MAX_S = 0.3
TEMPERATURE = 0.8


@dataclass(frozen=True, slots=True)
class Disconnects:
    clients: int = 100
    api_share: float = 0.5
    max_tokens: int = 48
    spread_s: float = 5.0
    idle_timeout_s: float = 60.0


@dataclass(frozen=True, slots=True)
class Plan:
    """What one client does, drawn from the seeded RNG."""

    index: int
    kind: str  # "api" or "chat"
    point: str  # one of POINTS
    after_chunks: int  # mid_stream: text chunks to read first
    abrupt: bool
    delay_s: float  # before sending
    early_s: float  # early: how long after sending
    seed: int


@dataclass(slots=True)
class Outcome:
    plan: Plan
    reached: bool = False  # the disconnect point was reached (not: the answer ended first)
    chunks: int = 0  # text chunks received
    ended: bool = False  # the answer ended before the point ([DONE] or done)
    status: int | None = None  # API: the HTTP status
    error: dict | None = None  # anything unexpected (an error frame, a refused request...)


def make_plans(config: Disconnects, seed: int) -> list[Plan]:
    rng = random.Random(seed)
    plans = []
    for index in range(config.clients):
        plans.append(
            Plan(
                index=index,
                kind="api" if rng.random() < config.api_share else "chat",
                point=rng.choice(POINTS),
                # NOTE: sampled answers often stop after 10-30 tokens; a k near max_tokens would
                # mostly see the answer end first.
                after_chunks=rng.randint(1, max(config.max_tokens // 3, 1)),
                abrupt=rng.random() < 0.5,
                delay_s=rng.uniform(0, config.spread_s),
                early_s=rng.uniform(0, EARLY_MAX_S),
                seed=rng.randrange(2**31),
            )
        )
    return plans


# --- API clients: raw HTTP, so the connection can be dropped at any byte ---


def _drop(writer: asyncio.StreamWriter, abrupt: bool) -> None:
    if abrupt:
        writer.transport.abort()  # no FIN handshake: the peer sees a reset
    else:
        writer.close()


async def api_client_run(port: int, site: dict, plan: Plan, max_tokens: int) -> Outcome:
    outcome = Outcome(plan)
    body = json.dumps(
        {
            "model": site["model"],
            "messages": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": question(plan.index, 0)},
            ],
            "stream": True,
            "max_tokens": max_tokens,
            "temperature": TEMPERATURE,
            "seed": plan.seed,
        }
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {HOST}:{port}\r\n"
        f"Authorization: Bearer {site['api_key']}\r\nContent-Type: application/json\r\n"
        f"Accept: text/event-stream\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        writer.write(head + body)
        await writer.drain()
        if plan.point == "early":
            await asyncio.sleep(plan.early_s)
            outcome.reached = True
            return outcome
        status_head = await reader.readuntil(b"\r\n\r\n")
        outcome.status = int(status_head.split(b" ", 2)[1])
        if outcome.status != 200:
            rest = await asyncio.wait_for(reader.read(2000), 10)
            outcome.error = {"code": f"HTTP {outcome.status}", "message": rest[-300:].decode()}
            return outcome
        while True:
            line = await reader.readline()
            if not line:
                outcome.error = {"code": "eof", "message": "the stream ended without [DONE]"}
                return outcome
            if not line.startswith(b"data: "):
                continue  # chunk sizes of the chunked encoding, blank separator lines
            data = line[len(b"data: ") :].strip()
            if data == b"[DONE]":
                outcome.ended = True
                return outcome
            event = json.loads(data)
            if "error" in event:
                outcome.error = {"code": "stream_error", "message": str(event["error"])[:300]}
                return outcome
            choices = event.get("choices") or []
            if not choices:
                continue  # the usage chunk
            choice = choices[0]
            if choice["delta"].get("content"):
                outcome.chunks += 1
            if plan.point == "before_first_token" or (
                plan.point == "mid_stream" and outcome.chunks >= plan.after_chunks
            ):
                outcome.reached = True
                return outcome
            if plan.point == "after_end" and choice.get("finish_reason"):
                outcome.reached = True
                return outcome
    finally:
        _drop(writer, plan.abrupt)


# --- Chat clients ---


async def chat_client_run(port: int, site: dict, plan: Plan) -> Outcome:
    outcome = Outcome(plan)
    cookie = f"{site['cookie_name']}={site['sessions'][plan.index % len(site['sessions'])]}"
    sock: ChatSocket = await open_chat(port, cookie)
    try:
        sock.send_json(
            {
                "type": "message",
                "conversation": None,
                "content": question(plan.index, 0),
                "seed": plan.seed,
                "profile": site["profile_id"],
                "collections": [],
            }
        )
        if plan.point == "early":
            await asyncio.sleep(plan.early_s)
            outcome.reached = True
            return outcome
        while True:
            item = await sock.frames.get()
            if item is CLOSED:
                outcome.error = {"code": "closed", "message": f"socket closed: {sock.close_info}"}
                return outcome
            kind = item.get("type")
            if kind == "error":
                outcome.error = {"code": item.get("code"), "message": item.get("message")}
                return outcome
            if kind == "token":
                outcome.chunks += 1
            if kind == "done" and plan.point != "after_end":
                outcome.ended = True
                return outcome
            if (
                (plan.point == "before_first_token" and kind == "start")
                or (plan.point == "mid_stream" and outcome.chunks >= plan.after_chunks)
                or (plan.point == "after_end" and kind == "done")
            ):
                outcome.reached = True
                return outcome
    finally:
        if plan.abrupt:
            sock.writer.transport.abort()
            sock._reading.cancel()
        else:
            await sock.close()


async def run_client(port: int, site: dict, plan: Plan, config: Disconnects) -> Outcome:
    await asyncio.sleep(plan.delay_s)
    try:
        if plan.kind == "api":
            run = api_client_run(port, site, plan, config.max_tokens)
        else:
            run = chat_client_run(port, site, plan)
        return await asyncio.wait_for(run, CLIENT_TIMEOUT_S)
    except (OSError, ConnectionError, TimeoutError, asyncio.IncompleteReadError) as error:
        outcome = Outcome(plan)
        outcome.error = {"code": type(error).__name__, "message": str(error)[:300]}
        return outcome


async def normal_requests(server: LiveServer, site: dict, max_tokens: int) -> dict:
    """After the storm: one non-streamed API answer and one chat turn, as any client would."""
    async with api_client(server, site["api_key"], CLIENT_TIMEOUT_S) as client:
        reply = await api_chat(
            client,
            site["model"],
            [{"role": "user", "content": "What is the capital of Italy?"}],
            stream=False,
            temperature=0,
            max_tokens=max_tokens,
        )
    cookie = f"{site['cookie_name']}={site['sessions'][0]}"
    sock = await open_chat(server.port, cookie)
    try:
        frame = {
            "type": "message",
            "conversation": None,
            "content": "Hello, who are you?",
            "seed": 7,
            "profile": site["profile_id"],
            "collections": [],
        }
        chat = await chat_exchange(sock, frame, CLIENT_TIMEOUT_S)
    finally:
        await sock.close()
    return {
        "api": {
            "ok": reply.error is None and bool(reply.text),
            "error": reply.error,
            "finish_reason": reply.finish_reason,
        },
        "chat": {
            "ok": chat.error is None and chat.message is not None and bool(chat.text),
            "error": chat.error,
            "finish_reason": (chat.message or {}).get("finish_reason"),
        },
    }


async def drive(server: LiveServer, site: dict, config: Disconnects, seed: int) -> dict:
    plans = make_plans(config, seed)
    began = time.perf_counter()
    outcomes = await asyncio.gather(
        *(run_client(server.port, site, plan, config) for plan in plans)
    )
    storm_s = time.perf_counter() - began
    after, waited_s = await asyncio.to_thread(wait_for_idle, server, config.idle_timeout_s)
    normal = await normal_requests(server, site, min(config.max_tokens, 16))
    return {
        "outcomes": list(outcomes),
        "storm_s": storm_s,
        "after": after,
        "waited_s": waited_s,
        "normal": normal,
    }


def run_disconnects(config: Disconnects, common: Common | None = None) -> dict:
    common = common or Common()
    if config.clients < 1 or config.max_tokens < 2 or not 0 <= config.api_share <= 1:
        raise ValueError("at least one client, max_tokens >= 2, api_share in [0, 1]")
    models_dir = Path(common.models_dir) if common.models_dir else default_models_dir()
    spec = {
        "model_config": {},
        "users": max(1, min(config.clients, 20)),
        "profile": {"temperature": TEMPERATURE, "max_tokens": config.max_tokens},
    }
    began = time.perf_counter()
    try:
        with LiveServer(
            models_dir=models_dir,
            torch_threads=common.torch_threads,
            ready_timeout_s=common.startup_timeout_s,
        ) as server:
            site = start_server(server, spec)
            before = engine_state(server)
            if before is None:
                raise CannotRunError("could not read /metrics")
            result = asyncio.run(drive(server, site, config, common.seed))
            health = healthz(server)
            alive = server.pid is not None
            final = engine_state(server)
            log_tail = server.log_tail()
    except LiveServerError as error:
        raise CannotRunError(str(error)) from None
    report = build_report(config, common, site, result, before, final, health, alive)
    report["wall_s"] = round(time.perf_counter() - began, 1)
    if any(not item["ok"] for item in report["checks"]):
        logger.warning("checks failed; the server's log ends:\n%s", log_tail)
    return report


def build_report(config, common, site, result, before, final, health, alive) -> dict:
    outcomes: list[Outcome] = result["outcomes"]
    after = result["after"]
    errors = [o for o in outcomes if o.error is not None]
    by_point: dict[str, dict[str, int]] = {}
    for o in outcomes:
        key = f"{o.plan.kind}/{o.plan.point}"
        entry = by_point.setdefault(key, {"clients": 0, "reached": 0, "ended_first": 0})
        entry["clients"] += 1
        entry["reached"] += o.reached
        entry["ended_first"] += o.ended
    finished_after = (final or after).finished if (final or after) else {}
    delta = {
        reason: finished_after.get(reason, 0) - before.finished.get(reason, 0)
        for reason in finished_after
    }
    mid_reached = sum(1 for o in outcomes if o.plan.point == "mid_stream" and o.reached)
    normal = result["normal"]
    checks = [
        check(
            "every client got as far as its disconnect point without an error",
            not errors,
            errors=len(errors),
            details=[
                {"client": o.plan.index, "kind": o.plan.kind, "point": o.plan.point, **o.error}
                for o in errors[:MAX_DETAILS]
            ],
        ),
        check(
            "disconnects happened mid-stream and reached the engine (aborted requests > 0)",
            mid_reached > 0 and delta.get("abort", 0) > 0,
            mid_stream_disconnects=mid_reached,
            engine_aborts=delta.get("abort", 0),
        ),
        check(
            f"engine idle within {config.idle_timeout_s:.0f} s (nothing running or waiting, "
            "KV usage 0)",
            after is not None and after.is_idle,
            engine=after.as_json() if after else None,
            waited_s=result["waited_s"],
        ),
        check(
            "no engine request ended in error",
            delta.get("error", 0) == 0,
            finished_by_reason=delta,
        ),
        check(
            "the server still answers a normal API request and a chat turn",
            alive and normal["api"]["ok"] and normal["chat"]["ok"],
            alive=alive,
            **normal,
        ),
        check("/healthz ok afterwards", health == "ok", status=health),
    ]
    return {
        "config": config_report(config, common),
        "server": server_report(site),
        "clients": len(outcomes),
        "api_clients": sum(1 for o in outcomes if o.plan.kind == "api"),
        "chat_clients": sum(1 for o in outcomes if o.plan.kind == "chat"),
        "abrupt": sum(1 for o in outcomes if o.plan.abrupt),
        "by_point": by_point,
        "storm_s": round(result["storm_s"], 2),
        "idle_after_s": result["waited_s"],
        "engine_finished_by_reason": delta,
        "engine_after": after.as_json() if after else None,
        "checks": checks,
    }


def summary(report: dict) -> list[str]:
    lines = [
        f"{report['clients']} clients ({report['api_clients']} API, {report['chat_clients']} "
        f"chat; {report['abrupt']} abrupt) in {report['storm_s']} s; engine idle after "
        f"{report['idle_after_s']} s; engine requests by finish reason "
        f"{report['engine_finished_by_reason']}",
        f"{'client/point':>28} {'clients':>7} {'reached':>7} {'ended first':>11}",
    ]
    for key, entry in sorted(report["by_point"].items()):
        lines.append(
            f"{key:>28} {entry['clients']:>7} {entry['reached']:>7} {entry['ended_first']:>11}"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = suite_parser("disconnects", __doc__)
    parser.add_argument("--clients", type=int, default=100, help="clients (100)")
    parser.add_argument(
        "--api-share", type=float, default=0.5, help="share of API clients, the rest chat (0.5)"
    )
    parser.add_argument("--max-tokens", type=int, default=48, help="answer length (48)")
    parser.add_argument(
        "--spread", type=float, default=5.0, help="clients start within this many seconds (5)"
    )
    parser.add_argument("--idle-timeout", type=float, default=60.0, help="seconds (60)")
    args = parser.parse_args(argv)
    config = Disconnects(
        clients=args.clients,
        api_share=args.api_share,
        max_tokens=args.max_tokens,
        spread_s=args.spread,
        idle_timeout_s=args.idle_timeout,
    )
    return run_suite(args, run_disconnects, config, summary)


if __name__ == "__main__":
    sys.exit(main())
