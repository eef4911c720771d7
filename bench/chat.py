"""Chat latency over the real stack: concurrent WebSocket chats of several turns each.

Starts a real daphne server (`harness.live_server.LiveServer`) on a free port with a throwaway
data dir (its own SQLite database and search index; the chat model comes from the shared models
cache), creates a user, an assistant profile (temperature 0, `--max-tokens`) and, by default, a
collection holding a small employee handbook, waits for `/healthz`, runs one warm-up turn, drives
`--chats` concurrent WebSocket chats of `--turns` turns each (a turn waits for `done` before the
next one). Every chat asks its own questions, so no two prompts are alike.

Reports per turn number: client-side TTFT (message sent → first `token` frame) p50/p95, the
server's TTFT p50 and per-stream decode speed (from `done`'s stats), mean prompt tokens and the
cached share (cached / prompt tokens, summed); overall output tokens/s; TTFT ratios of later turns
against turn 1 and the issue's targets (turns 2+ TTFT p50 <= 50% of turn 1; cached share >= 80%
from turn 2 on).

    python -m bench.chat --json              # 8 chats x 3 turns, 64-token answers
    python -m bench.chat --json --smoke      # 2 chats x 3 turns, 4-token answers
    python -m bench.chat --no-documents      # plain chat: no retrieval, no passages
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from pathlib import Path

import numpy as np

from harness import (
    SITE_TIMEOUT_S,
    CannotRunError,
    ChatClient,
    LiveServer,
    LiveServerError,
    TurnResult,
    counts,
    default_models_dir,
    rounded,
    run_cli,
)

logger = logging.getLogger(__name__)

LOG_TAIL_CHARS = 4000
MAX_ERROR_DETAILS = 20

SYSTEM_PROMPT = (
    "You are Cachet, the internal assistant of Northwind Logistics. You help employees with "
    "questions about holidays and leave, business travel, expenses, equipment, IT security and "
    "remote work. Answer from the numbered context passages of the company's documents when they "
    "are relevant and cite them like [1]. If the passages do not answer the question, say so in "
    "one sentence and name who to ask: the People team for leave and remote work, Finance for "
    "travel and expenses, IT for equipment and security. Be concise and friendly; use a short "
    "Markdown list for steps."
)

HANDBOOK = """# Northwind employee handbook

## Holidays and leave

Every employee gets 30 days of paid holiday per calendar year, plus the public holidays of the
office they work from. Part-time employees get the same share of days as their working time.

Up to five unused days may be carried over into the first quarter of the next year; days not
taken by March 31 expire. Requests of up to five days need two weeks' notice, longer absences
four weeks' notice, and anything over two weeks is approved by the head of department as well
as the team lead. Sick days are reported to the team lead before 10:00 and need a doctor's note
from the third day on.

## Business travel

Trains are preferred over flights for trips shorter than 600 kilometres or five hours door to
door; second class is the default, first class is allowed for trips over three hours. Flights are
booked in economy through the travel portal at least 14 days ahead where possible.

Hotels are booked through the travel portal too. The nightly limit is 150 euros, 220 euros in
London, Paris, Zurich and New York. Travel time during working hours counts as working time.

## Expenses

Expenses are claimed in the expense app within 30 days, with a photo of the receipt for every
item over 10 euros. Client meals are allowed up to 60 euros per person including tip, and the
claim names every guest and the business purpose. Taxis are fine late at night or when no public
transport runs within 30 minutes. Alcohol is not reimbursed except at client events approved in
advance. Claims are paid with the next salary run after the team lead approves them.

## Equipment

Laptops are replaced every three years, or earlier when IT confirms a hardware fault. For the
home office, every employee may order one monitor, a keyboard, a mouse and a headset from the
equipment catalogue once; a desk chair is reimbursed up to 300 euros with a receipt. A lost or
stolen laptop is reported to IT within 24 hours on the security hotline, so the disk can be
locked remotely, and to the police for theft.

## IT security

Passwords have at least 14 characters and are kept in the company password manager; they are
changed only when a leak is suspected. Multi-factor authentication is mandatory for email, the
VPN and the travel portal. Personal USB sticks must not be connected to company laptops; use the
shared drive instead. Suspected phishing is reported with the "Report phishing" button in the
mail client, never by forwarding the message. Screens are locked whenever you leave your desk.

## Remote work

Employees may work from home up to three days a week after their probation period, agreed with
the team lead; Tuesdays are office days for every team. Working from another country is allowed
for up to 20 working days a year within the EU, requested from the People team at least four
weeks ahead because of tax and insurance rules. Core hours are 10:00 to 15:00 in the office's
time zone.
"""

# (first question, follow-up, second follow-up) per topic of the handbook.
TOPICS = (
    (
        "How many days of paid holiday do I get per year?",
        "Can I carry unused holiday over into next year? I still have a few days left.",
        "Who has to approve it if I want to take three weeks off in one go?",
    ),
    (
        "I have a customer meeting 450 km away next month. Should I take the train or fly?",
        "What is the hotel limit per night if the meeting is in London instead?",
        "Does the time on the train count as working time?",
    ),
    (
        "How do I claim the cost of a dinner with a client?",
        "Until when do I have to submit the receipts?",
        "Do I need a receipt for a 20 euro taxi ride home after the dinner?",
    ),
    (
        "My laptop is almost four years old and very slow. Can I get a new one?",
        "Can I also order a second monitor for my home office?",
        "And what do I do if the laptop gets stolen on a trip?",
    ),
    (
        "How often do I have to change my password?",
        "Can I copy a presentation to my personal USB stick to work on it at home?",
        "I just got a strange email asking for my VPN login. What should I do?",
    ),
    (
        "How many days a week can I work from home?",
        "Could I work from my parents' place in Portugal for a month this summer?",
        "What are the core hours when I have to be reachable?",
    ),
)
NAMES = ("Amira", "Jonas", "Priya", "Mateo", "Chen", "Fatima", "Lukas", "Sofia", "Kwame", "Ines")
TEAMS = ("logistics", "sales", "finance", "warehouse", "customer support", "engineering")
WARMUP_QUESTION = "Hi! What kind of questions can you help me with?"
HANDBOOK_DOCUMENT = {
    "title": "Northwind employee handbook",
    "file_name": "handbook.md",
    "text": HANDBOOK,
}


def question(chat: int, turn: int) -> str:
    """Chat `chat`'s question at turn `turn` (1-based); the first one names the asker."""
    topic = TOPICS[chat % len(TOPICS)]
    text = topic[(turn - 1) % len(topic)]
    if turn > len(topic):
        text = f"One more thing about that (question {turn}): {text[0].lower()}{text[1:]}"
    if turn == 1:
        name, team = NAMES[chat % len(NAMES)], TEAMS[chat % len(TEAMS)]
        text = f"Hi, this is {name} from the {team} team (chat {chat + 1}). {text}"
    return text


def site_spec(*, max_tokens: int, top_k: int | None, with_documents: bool) -> dict:
    """What the bench asks `harness.site.prepare_site` for: a user, a profile, the handbook."""
    return {
        "label": "bench",
        "user": {"first_name": "Sam", "last_name": "Rivera"},
        "profile": {
            "system_prompt": SYSTEM_PROMPT,
            "temperature": 0.0,
            "max_tokens": max_tokens,
            "search_top_k": top_k,
        },
        "document": HANDBOOK_DOCUMENT if with_documents else None,
    }


# --- The chats ---


async def run_chat(client: ChatClient, index: int, turns: int, results: list[TurnResult]) -> None:
    """Chat `index`: `turns` turns on its own socket; stops at the first failed turn."""
    conversation = None
    try:
        sock = await client.connect()
    except (OSError, ConnectionError, TimeoutError) as error:
        results.append(TurnResult(index, 1, error={"code": "connect", "message": str(error)}))
        return
    try:
        for turn in range(1, turns + 1):
            result = TurnResult(index, turn, conversation=conversation)
            results.append(result)
            await client.turn(sock, result, question(index, turn), seed=index * 1000 + turn)
            if result.error is not None:
                logger.warning("chat %d turn %d: %s", index + 1, turn, result.error)
                return
            conversation = result.conversation
            logger.debug("chat %d turn %d answered: %r", index + 1, turn, result.answer)
            logger.info(
                "chat %d turn %d: ttft %.2fs, %s/%s prompt tokens cached",
                index + 1,
                turn,
                result.ttft_s or 0.0,
                result.stats["cached_tokens"],
                result.stats["prompt_tokens"],
            )
    finally:
        await sock.close()


async def drive(
    client: ChatClient, *, chats: int, turns: int, warmup: bool, ramp_s: float = 0.0
) -> tuple[list[TurnResult], TurnResult | None, float]:
    """Optionally one warm-up turn, then `chats` concurrent chats, the last one starting `ramp_s`
    after the first; returns the results and the wall time."""
    warm = None
    if warmup:
        # NOTE: loads the server's embedder and BM25 index and caches the system prompt, as on a
        # server that has been up for a while; not counted.
        try:
            sock = await client.connect()
        except (OSError, ConnectionError, TimeoutError) as error:
            raise CannotRunError(f"could not open the chat socket: {error}") from error
        warm = TurnResult(-1, 1)
        try:
            await client.turn(sock, warm, WARMUP_QUESTION, seed=0)
        finally:
            await sock.close()
        if warm.error is not None:
            raise CannotRunError(f"the warm-up turn failed: {warm.error}")
    results: list[TurnResult] = []
    started = time.perf_counter()

    async def start(index: int) -> None:
        await asyncio.sleep(ramp_s * index / max(chats - 1, 1))
        await run_chat(client, index, turns, results)

    await asyncio.gather(*(start(index) for index in range(chats)))
    return results, warm, time.perf_counter() - started


# --- The report ---


def _percentile(values: list[float], q: float) -> float | None:
    return rounded(np.percentile(values, q)) if values else None


def summarize_turn(results: list[TurnResult]) -> dict:
    answered = [r for r in results if r.error is None and r.stats is not None]
    ttfts = [r.ttft_s for r in answered if r.ttft_s is not None]
    stats = [r.stats for r in answered]
    server_ttfts = [s["ttft_s"] for s in stats if s["ttft_s"] is not None]
    decode = [s["tokens_per_s"] for s in stats if s["tokens_per_s"]]
    prompt = sum(s["prompt_tokens"] or 0 for s in stats)
    cached = sum(s["cached_tokens"] or 0 for s in stats)
    count = len(stats) or 1
    return {
        "answers": len(answered),
        "ttft_p50_s": _percentile(ttfts, 50),
        "ttft_p95_s": _percentile(ttfts, 95),
        "server_ttft_p50_s": _percentile(server_ttfts, 50),
        "total_p50_s": _percentile([r.total_s for r in answered], 50),
        "tokens_per_s_p50": rounded(np.percentile(decode, 50), 2) if decode else None,
        "prompt_tokens_mean": rounded(prompt / count, 1),
        "cached_tokens_mean": rounded(cached / count, 1),
        "completion_tokens_mean": rounded(
            sum(s["completion_tokens"] or 0 for s in stats) / count, 1
        ),
        "cached_share": rounded(cached / prompt, 3) if prompt else None,
        "sources_mean": rounded(sum(r.num_sources for r in answered) / count, 1),
        "no_token_answers": sum(1 for r in answered if r.ttft_s is None),
    }


def summarize(results: list[TurnResult], turns: int, wall_s: float) -> dict:
    per_turn = {
        str(n): summarize_turn([r for r in results if r.turn == n]) for n in range(1, turns + 1)
    }
    ratios = {}
    first = per_turn["1"]["ttft_p50_s"]
    for n in range(2, turns + 1):
        later = per_turn[str(n)]["ttft_p50_s"]
        ratios[f"turn{n}_ttft_ratio"] = (
            rounded(later / first, 3) if later is not None and first else None
        )
    later_turns = [per_turn[str(n)] for n in range(2, turns + 1)]
    targets = {
        "ttft_p50_le_half_of_turn1": (
            all(r is not None and r <= 0.5 for r in ratios.values()) if ratios else None
        ),
        "cached_share_ge_0_8_from_turn2": (
            all(t["cached_share"] is not None and t["cached_share"] >= 0.8 for t in later_turns)
            if later_turns
            else None
        ),
    }
    errors = [
        {"chat": r.chat + 1, "turn": r.turn, **r.error} for r in results if r.error is not None
    ]
    completion = sum(r.stats["completion_tokens"] or 0 for r in results if r.stats)
    return {
        "turns": per_turn,
        **ratios,
        "targets": targets,
        "output_tok_s": rounded(completion / wall_s, 2) if wall_s > 0 else None,
        "completion_tokens": completion,
        "wall_s": rounded(wall_s, 2),
        "errors": len(errors),
        "error_details": errors[:MAX_ERROR_DETAILS],
        "finish_reasons": counts(r.finish_reason for r in results if r.stats),
    }


def run_bench(
    *,
    chats: int = 8,
    turns: int = 3,
    max_tokens: int = 64,
    with_documents: bool = True,
    top_k: int | None = None,
    warmup: bool = True,
    ramp_s: float = 0.0,
    models_dir: Path | None = None,
    database_url: str | None = None,
    redis_url: str | None = None,
    torch_threads: int | None = None,
    kv_cache_mb: int | None = None,
    startup_timeout_s: float = 300.0,
    turn_timeout_s: float = 600.0,
) -> dict:
    """Run the whole benchmark against a fresh server and return the report (see the docstring)."""
    if chats < 1 or turns < 1 or max_tokens < 1:
        raise ValueError("chats, turns and max_tokens must be at least 1")
    models_dir = Path(models_dir) if models_dir is not None else default_models_dir()
    models_dir.mkdir(parents=True, exist_ok=True)
    load_start = os.getloadavg()[0]
    began = time.perf_counter()
    try:
        # NOTE: the server's models cache is the shared one, so the converted chat model is reused.
        with LiveServer(
            models_dir=models_dir,
            database_url=database_url,
            redis_url=redis_url,
            torch_threads=torch_threads,
            kv_cache_mb=kv_cache_mb,
            ready_timeout_s=startup_timeout_s,
        ) as server:
            spec = site_spec(max_tokens=max_tokens, top_k=top_k, with_documents=with_documents)
            site = server.call("harness.site:prepare_site", spec, timeout=SITE_TIMEOUT_S)
            setup_s = time.perf_counter() - began
            logger.info("site ready in %.1fs (chat model %s)", setup_s, site["chat_model_action"])
            began = time.perf_counter()
            try:
                server.start()
                startup_s = time.perf_counter() - began
                logger.info("server ready in %.1fs on %s", startup_s, server.url)
                client = ChatClient(
                    port=server.port,
                    cookie=f"{site['cookie_name']}={site['sessions'][0]}",
                    profile_id=site["profile_id"],
                    collection_ids=site["collection_ids"],
                    turn_timeout_s=turn_timeout_s,
                )
                results, warm, wall_s = asyncio.run(
                    drive(client, chats=chats, turns=turns, warmup=warmup, ramp_s=ramp_s)
                )
                metrics = server.engine_metrics()
                if any(r.error is not None for r in results):
                    logger.warning(
                        "turns failed; the server's log ends:\n%s", server.log_tail(LOG_TAIL_CHARS)
                    )
            finally:
                server.stop()
                if database_url:
                    try:
                        server.call("harness.site:cleanup_site", site)
                    except LiveServerError as error:
                        logger.warning("could not remove the bench's rows: %s", error)
    except LiveServerError as error:
        raise CannotRunError(str(error)) from None

    model = next((r.stats["model"] for r in results if r.stats), None)
    report = {
        "config": {
            "chats": chats,
            "turns": turns,
            "max_tokens": max_tokens,
            "with_documents": with_documents,
            "document_chunks": site["document_chunks"],
            "search_top_k": top_k,
            "warmup": warmup,
            "ramp_s": ramp_s,
            "model": model,
            "torch_threads": torch_threads or 0,  # 0: one per core
            "kv_cache_mb": kv_cache_mb,
            "cpu_count": os.cpu_count(),
            "database": "sqlite (temporary)" if not database_url else database_url.split(":")[0],
            "channel_layer": "redis" if redis_url else "in-memory",
            "load_avg_1m_start": round(load_start, 2),
            "load_avg_1m_end": round(os.getloadavg()[0], 2),
        },
        "server": {
            "setup_s": rounded(setup_s, 2),
            "startup_s": rounded(startup_s, 2),
            "warmup_ttft_s": rounded(warm.ttft_s) if warm else None,
            "engine": metrics,
        },
        **summarize(results, turns, wall_s),
    }
    return report


def format_report(report: dict) -> str:
    config = report["config"]
    lines = [
        f"{config['chats']} chats x {config['turns']} turns, max_tokens {config['max_tokens']}, "
        f"model {config['model']}, documents {'on' if config['with_documents'] else 'off'}, "
        f"{config['cpu_count']} CPUs (load {config['load_avg_1m_start']} at the start)",
        "",
        f"{'turn':>4} {'answers':>7} {'ttft p50':>9} {'ttft p95':>9} {'server p50':>10} "
        f"{'decode tok/s':>12} {'prompt tok':>10} {'cached':>7}",
    ]

    def show(value, unit="", digits=2):
        return "-" if value is None else f"{value:.{digits}f}{unit}"

    for number, turn in report["turns"].items():
        lines.append(
            f"{number:>4} {turn['answers']:>7} {show(turn['ttft_p50_s'], 's'):>9} "
            f"{show(turn['ttft_p95_s'], 's'):>9} {show(turn['server_ttft_p50_s'], 's'):>10} "
            f"{show(turn['tokens_per_s_p50'], '', 1):>12} "
            f"{show(turn['prompt_tokens_mean'], '', 0):>10} "
            f"{show(turn['cached_share'] and turn['cached_share'] * 100, '%', 0):>7}"
        )
    ratios = ", ".join(
        f"{key.removesuffix('_ttft_ratio')} {show(value, '', 2)}"
        for key, value in report.items()
        if key.endswith("_ttft_ratio")
    )
    targets = report["targets"]
    verdict = {True: "met", False: "NOT met", None: "-"}
    lines += [
        "",
        f"output {show(report['output_tok_s'], ' tok/s')} over {report['wall_s']} s; "
        f"errors {report['errors']}",
        f"TTFT p50 against turn 1: {ratios or '-'}",
        "target turns 2+ TTFT p50 <= 50% of turn 1: "
        f"{verdict[targets['ttft_p50_le_half_of_turn1']]}",
        f"target cached share >= 80% from turn 2: "
        f"{verdict[targets['cached_share_ge_0_8_from_turn2']]}",
    ]
    lines += [f"error: chat {e['chat']} turn {e['turn']}: {e}" for e in report["error_details"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.chat", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--json", action="store_true", help="print JSON (default: a table)")
    parser.add_argument("--chats", type=int, default=8, help="concurrent chats (default 8)")
    parser.add_argument("--turns", type=int, default=3, help="turns per chat (default 3)")
    parser.add_argument("--max-tokens", type=int, default=64, help="answer length (default 64)")
    parser.add_argument(
        "--with-documents",
        "--documents",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="search a handbook collection every turn, as a RAG chat does (default: on)",
    )
    parser.add_argument("--top-k", type=int, help="passages per turn (default: the server's)")
    parser.add_argument(
        "--warmup", action=argparse.BooleanOptionalAction, default=True, help="one uncounted turn"
    )
    parser.add_argument(
        "--ramp", type=float, default=0.0, help="seconds over which the chats start (default 0)"
    )
    parser.add_argument("--smoke", action="store_true", help="2 chats, 4-token answers")
    parser.add_argument(
        "--models-dir",
        type=Path,
        help="the models cache to reuse (default: $CACHET_DATA_DIR/models)",
    )
    parser.add_argument(
        "--database-url",
        help="a THROWAWAY database for the server (default: a temporary SQLite file); the bench "
        "migrates it and removes its own rows afterwards",
    )
    parser.add_argument("--redis-url", help="a Redis for the channel layer (default: in-memory)")
    parser.add_argument("--torch-threads", type=int, help="CACHET_TORCH_THREADS for the server")
    parser.add_argument("--kv-cache-mb", type=int, help="CACHET_KV_CACHE_MB for the server")
    parser.add_argument("--startup-timeout", type=float, default=300.0, help="seconds")
    parser.add_argument("--turn-timeout", type=float, default=600.0, help="seconds")
    args = parser.parse_args(argv)
    if args.smoke:
        args.chats, args.max_tokens = 2, 4
    if min(args.chats, args.turns, args.max_tokens) < 1 or args.ramp < 0:
        parser.error("--chats, --turns and --max-tokens must be at least 1, --ramp at least 0")
    return run_cli(
        lambda: run_bench(
            chats=args.chats,
            turns=args.turns,
            max_tokens=args.max_tokens,
            with_documents=args.with_documents,
            top_k=args.top_k,
            warmup=args.warmup,
            ramp_s=args.ramp,
            models_dir=args.models_dir,
            database_url=args.database_url,
            redis_url=args.redis_url,
            torch_threads=args.torch_threads,
            kv_cache_mb=args.kv_cache_mb,
            startup_timeout_s=args.startup_timeout,
            turn_timeout_s=args.turn_timeout,
        ),
        as_json=args.json,
        format_report=format_report,
        num_errors=lambda report: report["errors"],
    )


if __name__ == "__main__":
    sys.exit(main())
