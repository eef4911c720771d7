"""Load: concurrent WebSocket chats and streaming API clients for several rounds, then twins.

Starts a real server whose active model configuration runs float32 (see `TWINS` below), with one
user (and session) per chat, an assistant profile that samples (temperature > 0, short answers)
and an API key with high limits. Then, for `--rounds` rounds of `--duration` seconds, `--chats`
WebSocket chat loops and `--api-clients` streaming `/v1/chat/completions` loops run at once. Each
loop sends a request with an explicit seed, waits for its end and repeats until the round's time
is up (requests in flight then finish; nothing starts after the deadline). A chat keeps its
conversation for `--chat-turns` turns, then starts a new one. After each round, once the engine is
idle: the server's resident memory (psutil) and the engine's state (`/metrics`).

After the rounds, a sample of the streamed answers (`--twins N`, or `--twins all`) is produced
again, one "twin" each, with the same seed and prompt, and compared character for character.

Checks: no error frame, HTTP error, truncated stream or timeout; every loop answered in every
round; every chat answer saved exactly as it was streamed; every twin equal to its streamed
answer; resident memory after the last round within max(+10%, +100 MB) of the first round; no
engine request ended in error or abort; the engine idle (nothing running or waiting, KV usage 0)
after every round and after the whole run.

    python -m reliability.load --json              # 64 chats + 32 API clients, 3 x 120 s
    python -m reliability.load --json --chats 4 --api-clients 4 --rounds 2 --duration 10
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from harness import (
    CannotRunError,
    ChatReply,
    LiveServer,
    LiveServerError,
    chat_exchange,
    default_models_dir,
    open_chat,
)
from reliability.common import (
    MAX_DETAILS,
    SYSTEM_PROMPT,
    Common,
    api_chat,
    api_client,
    check,
    config_report,
    first_difference,
    question,
    rss_mb,
    run_suite,
    server_report,
    start_server,
    suite_parser,
    wait_for_idle,
)

logger = logging.getLogger(__name__)

# NOTE (TWINS): a twin must be the same computation, so equality is exact, not "close":
# - API answers: the same messages, seed and sampling fields with `stream: false`. Without `rag`
#   the API sends the messages to the model verbatim, so the prompt is the same token ids.
# - chat answers: a `regenerate` frame with the same seed on the same conversation. It rebuilds
#   the prompt from what the original turn saved (the user turn exactly as the model saw it, with
#   its date and name, and the earlier answers' own token ids), so the prompt is the same token
#   ids too. Asking the chat's question through the API would NOT be the same prompt (the chat
#   adds the profile's system prompt, today's facts and the user's name). Regenerate answers only
#   a conversation's last question, so chat twins are drawn from the last answers of
#   conversations. A chat answer's non-streamed form is also checked for every answer: the saved
#   message in `done` must equal the concatenated `token` frames.
# The model runs float32: in bfloat16 the logits depend visibly on the batch a request shares.
# In float32 they still differ in the last bits (measured: |dlogit| <= 2e-5 between a request
# alone and in a batch of 32); the engine's Gumbel-max sampler picks the same token unless the
# two best noisy scores are that close (the old inverse-CDF sampler parted ~1 in 80 sampled
# answers this way; docs/reliability.md, "Load").
# The native kernels stay off for the same reason: they quantize each token's activations (two
# int8 codes a value), so a prompt whose last tokens come along another path (a prefix-cache hit
# whose tail runs as decodes, a chunked prefill) differs by ~5e-3 in its logits, not ~1e-5
# (measured on SmolLM2-135M, Xeon with AMX: 1 to 3 of ~150 twins then parted, in 2 of 3 runs).
DTYPE = "float32"
SERVER_ENV = {"CACHET_NATIVE_KERNELS": "0"}
TEMPERATURE = 0.8
# NOTE: no nucleus cut by default: a token whose cumulative mass sits at top_p is in or out of
# the nucleus by the logits' last bits, one more way for a twin to part (`--top-p` sets one).
TOP_P = 1.0
REQUEST_TIMEOUT_S = 600.0
IDLE_TIMEOUT_S = 60.0
RSS_TOLERANCE_RATIO = 0.10
RSS_TOLERANCE_MB = 100.0


@dataclass(slots=True)
class Record:
    """One streamed answer: who asked what, with which seed, and what came back."""

    kind: str  # "chat" or "api"
    round: int  # 1-based
    client: int  # 0-based loop index within its kind
    iteration: int  # 0-based, within the round
    seed: int
    prompt: str  # the question (API: the user message; the system prompt is SYSTEM_PROMPT)
    text: str = ""  # streamed
    saved: str | None = None  # chat: the answer `done` reports as saved
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    conversation: int | None = None
    turn: int = 0  # chat: 1-based turn in its conversation
    error: dict | None = None
    wall_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Load:
    chats: int = 64
    api_clients: int = 32
    rounds: int = 3
    duration_s: float = 120.0
    chat_turns: int = 2
    max_tokens: int = 24
    twins: int | None = 64  # None: every eligible answer
    twin_concurrency: int = 8
    temperature: float = TEMPERATURE
    top_p: float = TOP_P
    kv_cache_mb: int = 512
    max_num_seqs: int = 32


def seed_of(base: int, kind: str, round_no: int, client: int, iteration: int) -> int:
    """A distinct seed per request (iteration < 100,000 in any bounded round)."""
    return (((base * 10 + round_no) * 2 + (kind == "api")) * 1000 + client) * 100_000 + iteration


@dataclass(slots=True)
class Context:
    server: LiveServer
    site: dict
    load: Load
    base_seed: int
    client: object  # openai.AsyncOpenAI

    def cookie(self, chat: int) -> str:
        sessions = self.site["sessions"]
        return f"{self.site['cookie_name']}={sessions[chat % len(sessions)]}"

    def api_params(self, seed: int) -> dict:
        return {
            "temperature": self.load.temperature,
            "top_p": self.load.top_p,
            "max_tokens": self.load.max_tokens,
            "seed": seed,
        }


def api_messages(prompt: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": prompt}]


# --- The loops ---


async def chat_loop(ctx: Context, index: int, round_no: int, deadline: float, out: list) -> None:
    """One chat on its own socket: turns until the deadline; stops at the first failure."""
    loop = asyncio.get_running_loop()
    try:
        sock = await open_chat(ctx.server.port, ctx.cookie(index))
    except (OSError, ConnectionError, TimeoutError) as error:
        seed = seed_of(ctx.base_seed, "chat", round_no, index, 0)
        out.append(
            Record(
                "chat",
                round_no,
                index,
                0,
                seed,
                "",
                error={"code": "connect", "message": str(error)},
            )
        )
        return
    conversation, turn, iteration = None, 0, 0
    try:
        while loop.time() < deadline:
            seed = seed_of(ctx.base_seed, "chat", round_no, index, iteration)
            content = question(index, iteration)
            frame = {
                "type": "message",
                "conversation": conversation,
                "content": content,
                "seed": seed,
            }
            if conversation is None:
                frame |= {"profile": ctx.site["profile_id"], "collections": []}
            began = time.perf_counter()
            reply = await chat_exchange(sock, frame, REQUEST_TIMEOUT_S)
            record = chat_record(reply, round_no, index, iteration, seed, content, turn + 1)
            record.wall_s = round(time.perf_counter() - began, 3)
            out.append(record)
            iteration += 1
            if reply.error is not None:
                logger.warning("chat %d round %d: %s", index + 1, round_no, reply.error)
                return
            conversation, turn = reply.conversation, turn + 1
            if turn >= ctx.load.chat_turns:
                conversation, turn = None, 0
    finally:
        await sock.close()


def chat_record(
    reply: ChatReply, round_no: int, index: int, iteration: int, seed: int, content: str, turn: int
) -> Record:
    message = reply.message or {}
    stats = reply.stats
    return Record(
        "chat",
        round_no,
        index,
        iteration,
        seed,
        content,
        text=reply.text,
        saved=reply.saved_text,
        finish_reason=message.get("finish_reason"),
        prompt_tokens=stats.get("prompt_tokens"),
        completion_tokens=stats.get("completion_tokens"),
        conversation=reply.conversation,
        turn=turn,
        error=reply.error,
    )


async def api_loop(ctx: Context, index: int, round_no: int, deadline: float, out: list) -> None:
    """One API client: streamed completions until the deadline; stops at the first failure."""
    loop = asyncio.get_running_loop()
    iteration = 0
    while loop.time() < deadline:
        seed = seed_of(ctx.base_seed, "api", round_no, index, iteration)
        content = question(1000 + index, iteration)
        began = time.perf_counter()
        reply = await api_chat(
            ctx.client,
            ctx.site["model"],
            api_messages(content),
            stream=True,
            **ctx.api_params(seed),
        )
        out.append(
            Record(
                "api",
                round_no,
                index,
                iteration,
                seed,
                content,
                text=reply.text,
                finish_reason=reply.finish_reason,
                prompt_tokens=reply.prompt_tokens,
                completion_tokens=reply.completion_tokens,
                error=reply.error,
                wall_s=round(time.perf_counter() - began, 3),
            )
        )
        iteration += 1
        if reply.error is not None:
            logger.warning("API client %d round %d: %s", index + 1, round_no, reply.error)
            return


async def run_round(ctx: Context, round_no: int) -> tuple[list[Record], float]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + ctx.load.duration_s
    out: list[Record] = []
    began = time.perf_counter()
    await asyncio.gather(
        *(chat_loop(ctx, i, round_no, deadline, out) for i in range(ctx.load.chats)),
        *(api_loop(ctx, i, round_no, deadline, out) for i in range(ctx.load.api_clients)),
    )
    return out, time.perf_counter() - began


async def warm_up(ctx: Context) -> None:
    """One chat turn and one API request, not counted (lazy set-up, the system prompt cached)."""
    sock = await open_chat(ctx.server.port, ctx.cookie(0))
    try:
        frame = {
            "type": "message",
            "conversation": None,
            "content": "Hello!",
            "seed": 1,
            "profile": ctx.site["profile_id"],
            "collections": [],
        }
        reply = await chat_exchange(sock, frame, REQUEST_TIMEOUT_S)
    finally:
        await sock.close()
    if reply.error is not None:
        raise CannotRunError(f"the warm-up chat turn failed: {reply.error}")
    answer = await api_chat(
        ctx.client, ctx.site["model"], api_messages("Hello!"), stream=True, **ctx.api_params(1)
    )
    if answer.error is not None:
        raise CannotRunError(f"the warm-up API request failed: {answer.error}")


# --- Twins ---


def twin_candidates(records: list[Record]) -> tuple[list[Record], list[Record]]:
    """(API answers, chat answers that are the last answer of their conversation), error-free."""
    api = [r for r in records if r.kind == "api" and r.error is None]
    by_conversation: dict[int, list[Record]] = {}
    for record in records:
        if record.kind == "chat" and record.conversation is not None:
            by_conversation.setdefault(record.conversation, []).append(record)
    chat = []
    for answers in by_conversation.values():
        if all(r.error is None for r in answers):
            chat.append(max(answers, key=lambda r: r.turn))
    return api, chat


def sample_twins(
    api: list[Record], chat: list[Record], size: int | None, rng: random.Random
) -> list[Record]:
    if size is None or size >= len(api) + len(chat):
        return api + chat
    num_chat = min(len(chat), size // 2)
    num_api = min(len(api), size - num_chat)
    num_chat = min(len(chat), size - num_api)
    return rng.sample(api, num_api) + rng.sample(chat, num_chat)


async def make_twin(ctx: Context, record: Record) -> dict:
    """The twin of one streamed answer, compared with it."""
    if record.kind == "api":
        twin = await api_chat(
            ctx.client,
            ctx.site["model"],
            api_messages(record.prompt),
            stream=False,
            **ctx.api_params(record.seed),
        )
        twin_text, error = twin.text, twin.error
        numbers = {
            "finish_reason": [record.finish_reason, twin.finish_reason],
            "completion_tokens": [record.completion_tokens, twin.completion_tokens],
            "prompt_tokens": [record.prompt_tokens, twin.prompt_tokens],
        }
        same = (
            twin.error is None
            and twin.text == record.text
            and twin.finish_reason == record.finish_reason
            and twin.completion_tokens == record.completion_tokens
        )
    else:
        sock = await open_chat(ctx.server.port, ctx.cookie(record.client))
        try:
            frame = {"type": "regenerate", "conversation": record.conversation, "seed": record.seed}
            reply = await chat_exchange(sock, frame, REQUEST_TIMEOUT_S)
        finally:
            await sock.close()
        twin_text, error = reply.text, reply.error
        message = reply.message or {}
        numbers = {
            "finish_reason": [record.finish_reason, message.get("finish_reason")],
            "completion_tokens": [record.completion_tokens, reply.stats.get("completion_tokens")],
            "prompt_tokens": [record.prompt_tokens, reply.stats.get("prompt_tokens")],
            "conversation": record.conversation,
            "turn": record.turn,
        }
        same = (
            reply.error is None
            and reply.text == record.text
            and reply.saved_text == record.text
            and reply.stats.get("prompt_tokens") == record.prompt_tokens
            and reply.stats.get("completion_tokens") == record.completion_tokens
        )
    result = {"kind": record.kind, "seed": record.seed, "round": record.round, "same": same}
    if not same:
        result |= {
            "prompt": record.prompt,
            "error": error,
            **numbers,
            **first_difference(record.text, twin_text),
        }
    return result


async def run_twins(ctx: Context, sample: list[Record]) -> list[dict]:
    gate = asyncio.Semaphore(ctx.load.twin_concurrency)

    async def one(record: Record) -> dict:
        async with gate:
            return await make_twin(ctx, record)

    return list(await asyncio.gather(*(one(record) for record in sample)))


# --- The run ---


async def drive(ctx: Context) -> dict:
    """Warm-up, the rounds (each followed by memory and engine readings), then the twins."""
    server = ctx.server
    await warm_up(ctx)
    idle, _ = await asyncio.to_thread(wait_for_idle, server, IDLE_TIMEOUT_S)
    baseline = {"rss_mb": rss_mb(server.pid), "engine": idle.as_json() if idle else None}
    logger.info("warmed up; server RSS %s MB", baseline["rss_mb"])
    records: list[Record] = []
    rounds = []
    for round_no in range(1, ctx.load.rounds + 1):
        out, wall_s = await run_round(ctx, round_no)
        records += out
        state, waited_s = await asyncio.to_thread(wait_for_idle, server, IDLE_TIMEOUT_S)
        answered = [r for r in out if r.error is None]
        tokens = sum(r.completion_tokens or 0 for r in answered)
        summary = {
            "round": round_no,
            "wall_s": round(wall_s, 2),
            "chat_answers": sum(1 for r in answered if r.kind == "chat"),
            "api_answers": sum(1 for r in answered if r.kind == "api"),
            "errors": sum(1 for r in out if r.error is not None),
            "completion_tokens": tokens,
            "output_tok_s": round(tokens / wall_s, 2) if wall_s > 0 else None,
            "clients_answered": len({(r.kind, r.client) for r in answered}),
            "rss_mb": rss_mb(server.pid),
            "idle_wait_s": waited_s,
            "engine": state.as_json() if state else None,
        }
        rounds.append(summary)
        logger.info("round %d: %s", round_no, summary)

    api, chat = twin_candidates(records)
    rng = random.Random(ctx.base_seed)
    sample = sample_twins(api, chat, ctx.load.twins, rng)
    logger.info("twins: %d of %d API and %d chat answers", len(sample), len(api), len(chat))
    began = time.perf_counter()
    twins = await run_twins(ctx, sample)
    twins_s = time.perf_counter() - began
    return {
        "baseline": baseline,
        "records": records,
        "rounds": rounds,
        "twins": twins,
        "twins_s": twins_s,
        "twin_candidates": {"api": len(api), "chat": len(chat)},
    }


def run_load(load: Load, common: Common | None = None) -> dict:
    """The whole suite against a fresh server; the report with its checks."""
    common = common or Common()
    if min(load.chats, load.api_clients) < 0 or load.chats + load.api_clients < 1:
        raise ValueError("at least one chat or API client")
    if load.rounds < 1 or load.duration_s <= 0 or load.chat_turns < 1 or load.max_tokens < 1:
        raise ValueError("rounds, duration, chat turns and max_tokens must be positive")
    models_dir = Path(common.models_dir) if common.models_dir else default_models_dir()
    spec = {
        "model_config": {
            "dtype": DTYPE,
            "kv_cache_mb": load.kv_cache_mb,
            "max_num_seqs": load.max_num_seqs,
            "max_num_batched_tokens": max(512, load.max_num_seqs),
        },
        "users": max(load.chats, 1),
        "profile": {
            "temperature": load.temperature,
            "top_p": load.top_p,
            "max_tokens": load.max_tokens,
        },
    }
    began = time.perf_counter()
    try:
        with LiveServer(
            models_dir=models_dir,
            env=SERVER_ENV,
            torch_threads=common.torch_threads,
            ready_timeout_s=common.startup_timeout_s,
        ) as server:
            site = start_server(server, spec)

            async def main() -> dict:
                async with api_client(server, site["api_key"], REQUEST_TIMEOUT_S) as client:
                    ctx = Context(server, site, load, common.seed, client)
                    return await drive(ctx)

            result = asyncio.run(main())
            final, final_wait_s = wait_for_idle(server, IDLE_TIMEOUT_S)
            final_rss = rss_mb(server.pid)
            log_tail = server.log_tail()
    except LiveServerError as error:
        raise CannotRunError(str(error)) from None
    report = build_report(load, common, site, result, final, final_wait_s, final_rss)
    report["wall_s"] = round(time.perf_counter() - began, 1)
    if num_failed_checks(report):
        logger.warning("checks failed; the server's log ends:\n%s", log_tail)
    return report


def num_failed_checks(report: dict) -> int:
    return sum(1 for item in report["checks"] if not item["ok"])


def build_report(load, common, site, result, final, final_wait_s, final_rss) -> dict:
    records: list[Record] = result["records"]
    rounds = result["rounds"]
    twins = result["twins"]
    errors = [r for r in records if r.error is not None]
    chats = [r for r in records if r.kind == "chat" and r.error is None]
    unsaved = [r for r in chats if r.saved != r.text]
    expected_clients = load.chats + load.api_clients
    silent_rounds = [r["round"] for r in rounds if r["clients_answered"] < expected_clients]
    mismatched = [t for t in twins if not t["same"]]
    first_rss, last_rss = rounds[0]["rss_mb"], rounds[-1]["rss_mb"]
    allowed_mb = (
        max(first_rss * RSS_TOLERANCE_RATIO, RSS_TOLERANCE_MB) if first_rss is not None else None
    )
    growth_mb = (
        round(last_rss - first_rss, 1) if first_rss is not None and last_rss is not None else None
    )
    finished = (final.finished if final else {}) or {}
    not_idle_rounds = [r["round"] for r in rounds if not (r["engine"] and _idle(r["engine"]))]
    reasons: dict[str, int] = {}
    for r in records:
        if r.error is None:
            reasons[str(r.finish_reason)] = reasons.get(str(r.finish_reason), 0) + 1
    checks = [
        check(
            "no errors (error frames, HTTP errors, truncated streams, timeouts)",
            not errors,
            errors=len(errors),
            details=[
                {"kind": r.kind, "client": r.client, "round": r.round, **r.error}
                for r in errors[:MAX_DETAILS]
            ],
        ),
        check(
            "every client answered in every round",
            not silent_rounds,
            clients=expected_clients,
            rounds_short=silent_rounds,
        ),
        check(
            "every answer ended normally (finish reason stop or length)",
            set(reasons) <= {"stop", "length"},
            finish_reasons=reasons,
        ),
        check(
            "every chat answer was saved exactly as streamed",
            not unsaved,
            chat_answers=len(chats),
            differing=len(unsaved),
        ),
        check(
            "every twin (same seed, same prompt) equals its streamed answer",
            bool(twins) and not mismatched,
            checked=len(twins),
            checked_api=sum(1 for t in twins if t["kind"] == "api"),
            checked_chat=sum(1 for t in twins if t["kind"] == "chat"),
            candidates=result["twin_candidates"],
            mismatched=len(mismatched),
            details=mismatched[:MAX_DETAILS],
        ),
        check(
            f"resident memory flat: last round within max(+{RSS_TOLERANCE_RATIO:.0%}, "
            f"+{RSS_TOLERANCE_MB:.0f} MB) of round 1",
            growth_mb is not None and growth_mb <= allowed_mb,
            rss_mb_by_round=[r["rss_mb"] for r in rounds],
            rss_mb_after_warmup=result["baseline"]["rss_mb"],
            growth_mb=growth_mb,
            allowed_mb=round(allowed_mb, 1) if allowed_mb is not None else None,
        ),
        check(
            "no engine request ended in error or abort",
            bool(finished) and finished.get("error", 0) == 0 and finished.get("abort", 0) == 0,
            finished_by_reason=finished,
        ),
        check(
            "engine idle after every round (nothing running or waiting, KV usage 0)",
            not not_idle_rounds,
            rounds_not_idle=not_idle_rounds,
        ),
        check(
            "engine idle after the run (nothing running or waiting, KV usage 0)",
            final is not None and final.is_idle,
            engine=final.as_json() if final else None,
            waited_s=final_wait_s,
        ),
    ]
    answered = [r for r in records if r.error is None]
    return {
        "config": config_report(load, common),
        "server": server_report(
            site, rss_mb_after_warmup=result["baseline"]["rss_mb"], rss_mb_at_end=final_rss
        ),
        "rounds": rounds,
        "answers": len(answered),
        "chat_answers": sum(1 for r in answered if r.kind == "chat"),
        "api_answers": sum(1 for r in answered if r.kind == "api"),
        "completion_tokens": sum(r.completion_tokens or 0 for r in answered),
        "errors": len(errors),
        "twins_checked": len(twins),
        "twins_s": round(result["twins_s"], 2),
        "engine_at_end": final.as_json() if final else None,
        "checks": checks,
    }


def _idle(engine: dict) -> bool:
    return engine["running"] == 0 and engine["waiting"] == 0 and engine["kv_usage"] == 0.0


def summary(report: dict) -> list[str]:
    config = report["config"]
    lines = [
        f"{config['chats']} chats + {config['api_clients']} API clients, {config['rounds']} "
        f"rounds x {config['duration_s']} s, {config['max_tokens']}-token answers, "
        f"temperature {config['temperature']}, top_p {config['top_p']}, "
        f"{report['server']['model_config']['dtype']}",
        f"{'round':>5} {'chat':>5} {'api':>5} {'errors':>6} {'tok/s':>7} {'RSS MB':>8} {'kv':>5}",
    ]
    for r in report["rounds"]:
        engine = r["engine"] or {}
        lines.append(
            f"{r['round']:>5} {r['chat_answers']:>5} {r['api_answers']:>5} {r['errors']:>6} "
            f"{r['output_tok_s'] or 0:>7.1f} {r['rss_mb'] or 0:>8.1f} "
            f"{engine.get('kv_usage', -1):>5.2f}"
        )
    lines.append(f"twins checked: {report['twins_checked']} in {report['twins_s']} s")
    return lines


def parse_twins(value: str) -> int | None:
    if value == "all":
        return None
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError("--twins takes a positive number or 'all'")
    return number


def main(argv: list[str] | None = None) -> int:
    parser = suite_parser("load", __doc__)
    parser.add_argument("--chats", type=int, default=64, help="WebSocket chat loops (64)")
    parser.add_argument("--api-clients", type=int, default=32, help="streaming API loops (32)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (3)")
    parser.add_argument("--duration", type=float, default=120.0, help="seconds a round (120)")
    parser.add_argument("--chat-turns", type=int, default=2, help="turns a conversation (2)")
    parser.add_argument("--max-tokens", type=int, default=24, help="answer length (24)")
    parser.add_argument(
        "--twins", type=parse_twins, default=64, help="answers re-made and compared, or 'all' (64)"
    )
    parser.add_argument("--twin-concurrency", type=int, default=8, help="twins at once (8)")
    parser.add_argument(
        "--temperature", type=float, default=TEMPERATURE, help="sampling temperature (0.8)"
    )
    parser.add_argument(
        "--top-p", type=float, default=TOP_P, help="nucleus sampling cut (1.0: none; see TOP_P)"
    )
    parser.add_argument("--kv-cache-mb", type=int, default=512, help="the engine's KV budget")
    parser.add_argument("--max-num-seqs", type=int, default=32, help="requests decoded together")
    args = parser.parse_args(argv)
    load = Load(
        chats=args.chats,
        api_clients=args.api_clients,
        rounds=args.rounds,
        duration_s=args.duration,
        chat_turns=args.chat_turns,
        max_tokens=args.max_tokens,
        twins=args.twins,
        twin_concurrency=args.twin_concurrency,
        temperature=args.temperature,
        top_p=args.top_p,
        kv_cache_mb=args.kv_cache_mb,
        max_num_seqs=args.max_num_seqs,
    )
    return run_suite(args, run_load, load, summary)


if __name__ == "__main__":
    sys.exit(main())
