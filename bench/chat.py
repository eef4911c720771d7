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
import base64
import contextlib
import hashlib
import json
import logging
import os
import secrets
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.live_server import LiveServer, LiveServerError, default_models_dir

logger = logging.getLogger(__name__)

HOST = "127.0.0.1"
SITE_COMMAND_TIMEOUT_S = 900.0  # includes converting the chat model on a fresh clone (~45 s)
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


class BenchError(RuntimeError):
    """The benchmark could not run (the server did not start, setting up the site failed...)."""


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


# --- The site: models, user, profile, documents (run by `LiveServer.call`, in a Django shell) ---


def prepare_site(spec: dict) -> dict:
    """Prepare the models, and add the bench's user, profile and handbook collection.

    NOTE: runs in a Django shell of the server's settings (`LiveServer.call`), not in this
    process: Django reads its settings once per process, and the caller (the test suite) may
    already have set up Django on other settings.
    """
    from django.conf import settings
    from django.contrib.auth.models import User
    from django.core.files.base import ContentFile
    from django.test import Client

    from chat.models import AssistantProfile
    from inference.model_files import resolve_chat_model, resolve_embedding_model
    from retrieval.models import Collection, Document

    # NOTE: converts the GGUF once on a fresh clone, into the shared cache (<data dir>/models is a
    # link to it); afterwards the server finds it cached.
    chat_model = resolve_chat_model(settings.CACHET_MODEL, settings.MODELS_DIR)
    resolve_embedding_model(settings.CACHET_EMBEDDING_MODEL)
    token = secrets.token_hex(4)
    user = User.objects.create_user(
        f"bench-{token}", password=secrets.token_urlsafe(24), first_name="Sam", last_name="Rivera"
    )
    profile = AssistantProfile.objects.create(
        name=f"Benchmark {token}",
        system_prompt=SYSTEM_PROMPT,
        temperature=0.0,
        max_tokens=spec["max_tokens"],
        search_top_k=spec["top_k"],
    )
    collection_ids, num_chunks = [], 0
    if spec["with_documents"]:
        from retrieval.ingest import ingest
        from retrieval.search import get_retriever

        collection = Collection.objects.create(name=f"Benchmark handbook {token}")
        collection.readers.add(user)
        profile.collections.add(collection)
        document = Document.objects.create(
            collection=collection,
            title="Northwind employee handbook",
            file=ContentFile(HANDBOOK.encode(), name="handbook.md"),
            created_by=user,
        )
        document = ingest(document.pk, get_retriever())
        if document is None or document.status != Document.Status.READY:
            reason = document.error if document is not None else "the document vanished"
            raise BenchError(f"ingesting the handbook failed: {reason}")
        collection_ids, num_chunks = [collection.pk], document.chunks.count()
    client = Client()
    client.force_login(user)
    return {
        "cookie_name": settings.SESSION_COOKIE_NAME,
        "session": client.cookies[settings.SESSION_COOKIE_NAME].value,
        "user_id": user.pk,
        "profile_id": profile.pk,
        "collection_ids": collection_ids,
        "document_chunks": num_chunks,
        "chat_model_dir": str(chat_model.directory),
        "chat_model_action": chat_model.action,
    }


def cleanup_site(spec: dict) -> dict:
    """Delete what `prepare_site` added (for a database that outlives the run)."""
    from django.contrib.auth.models import User
    from django.contrib.sessions.models import Session

    from chat.models import AssistantProfile
    from retrieval.models import Collection

    Collection.objects.filter(pk__in=spec["collection_ids"]).delete()
    AssistantProfile.objects.filter(pk=spec["profile_id"]).delete()
    User.objects.filter(pk=spec["user_id"]).delete()  # its conversations go with it
    Session.objects.filter(session_key=spec["session"]).delete()
    return {"deleted": True}


# --- The WebSocket clients ---


@dataclass(slots=True)
class TurnResult:
    chat: int  # 0-based; -1 for the warm-up
    turn: int  # 1-based
    ttft_s: float | None = None  # client side: message sent -> first token frame
    total_s: float | None = None  # client side: message sent -> done
    token_frames: int = 0
    num_sources: int = 0
    conversation: int | None = None
    stats: dict | None = None
    finish_reason: str | None = None
    answer: str = ""
    error: dict | None = None  # {"code", "message"}


CLOSED = object()  # put in a socket's frame queue when it closes
WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
OP_CONTINUATION, OP_TEXT, OP_CLOSE, OP_PING, OP_PONG = 0x0, 0x1, 0x8, 0x9, 0xA


def _masked(data: bytes, mask: bytes) -> bytes:
    if not data:
        return b""
    key = (mask * (len(data) // 4 + 1))[: len(data)]
    return (int.from_bytes(data, "big") ^ int.from_bytes(key, "big")).to_bytes(len(data), "big")


class ChatSocket:
    """A minimal RFC 6455 client over asyncio streams: JSON text frames, ping/pong, close.

    NOTE: hand-rolled on purpose: `websockets` is not installed, and autobahn's asyncio flavour
    refuses to run in a process where daphne already chose Twisted for txaio (the test suite).
    Received frames are decoded into `frames`; `CLOSED` follows the last one.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.frames: asyncio.Queue = asyncio.Queue()
        self.close_info: tuple[int, str] | None = None
        self._close_sent = False
        self._reading = asyncio.create_task(self._read_loop())

    @classmethod
    async def connect(cls, port: int, path: str, headers: dict[str, str]) -> ChatSocket:
        reader, writer = await asyncio.open_connection(HOST, port)
        key = base64.b64encode(secrets.token_bytes(16)).decode()
        request = [
            f"GET {path} HTTP/1.1",
            f"Host: {HOST}:{port}",
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Key: {key}",
            "Sec-WebSocket-Version: 13",
            *(f"{name}: {value}" for name, value in headers.items()),
        ]
        writer.write(("\r\n".join(request) + "\r\n\r\n").encode())
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError) as error:
            writer.close()
            raise ConnectionError(f"no handshake answer: {error}") from None
        status, *lines = head.split("\r\n")
        answer = {n.strip().lower(): v.strip() for n, _, v in (x.partition(":") for x in lines)}
        expected = base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()
        if status.split(" ")[1:2] != ["101"] or answer.get("sec-websocket-accept") != expected:
            writer.close()
            raise ConnectionError(f"handshake refused: {status}")
        return cls(reader, writer)

    def _send_frame(self, opcode: int, payload: bytes) -> None:
        size = len(payload)
        if size < 126:
            length = bytes([0x80 | size])
        elif size < 1 << 16:
            length = bytes([0x80 | 126]) + size.to_bytes(2, "big")
        else:
            length = bytes([0x80 | 127]) + size.to_bytes(8, "big")
        mask = secrets.token_bytes(4)  # clients must mask every frame
        self.writer.write(bytes([0x80 | opcode]) + length + mask + _masked(payload, mask))

    async def next_frame(self, deadline: float, timeout_s: float) -> dict:
        """The next received frame; an `error` frame (code `timeout` or `closed`) when none
        comes before the loop time `deadline` or the socket closes."""
        loop = asyncio.get_running_loop()
        try:
            item = await asyncio.wait_for(self.frames.get(), max(deadline - loop.time(), 0))
        except TimeoutError:
            return {"type": "error", "code": "timeout", "message": f"no done in {timeout_s:g}s"}
        if item is CLOSED:
            return {
                "type": "error",
                "code": "closed",
                "message": f"socket closed: {self.close_info}",
            }
        return item

    def send_json(self, frame: dict) -> None:
        self._send_frame(OP_TEXT, json.dumps(frame).encode())

    async def _read_frame(self) -> tuple[bool, int, bytes]:
        first, second = await self.reader.readexactly(2)
        size = second & 0x7F
        if size >= 126:
            size = int.from_bytes(await self.reader.readexactly(2 if size == 126 else 8), "big")
        mask = await self.reader.readexactly(4) if second & 0x80 else None
        payload = await self.reader.readexactly(size)
        return bool(first & 0x80), first & 0x0F, _masked(payload, mask) if mask else payload

    async def _read_loop(self) -> None:
        parts: list[bytes] = []
        try:
            while True:
                fin, opcode, payload = await self._read_frame()
                if opcode == OP_CLOSE:
                    code = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else 1005
                    self.close_info = (code, payload[2:].decode(errors="replace"))
                    if not self._close_sent:
                        self._close_sent = True
                        self._send_frame(OP_CLOSE, payload[:2])
                    return
                if opcode == OP_PING:
                    self._send_frame(OP_PONG, payload)
                elif opcode in (OP_TEXT, OP_CONTINUATION):
                    parts.append(payload)
                    if fin:
                        text, parts = b"".join(parts), []
                        try:
                            self.frames.put_nowait(json.loads(text))
                        except ValueError:
                            message = f"not JSON: {text[:80]!r}"
                            self.frames.put_nowait(
                                {"type": "error", "code": "client_bad_json", "message": message}
                            )
        except (asyncio.IncompleteReadError, ConnectionError) as error:
            self.close_info = self.close_info or (1006, f"connection lost: {error}")
        finally:
            self.frames.put_nowait(CLOSED)

    async def close(self) -> None:
        with contextlib.suppress(ConnectionError, RuntimeError):
            if not self._close_sent:
                self._close_sent = True
                self._send_frame(OP_CLOSE, (1000).to_bytes(2, "big"))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._reading), 5)
            self.writer.close()
            with contextlib.suppress(OSError):
                await self.writer.wait_closed()
        self._reading.cancel()


@dataclass(frozen=True, slots=True)
class ChatClient:
    """How to reach the server and who to be: the chat socket's URL, origin and session."""

    port: int
    cookie: str  # "sessionid=..."
    profile_id: int
    collection_ids: list[int]
    turn_timeout_s: float

    async def connect(self) -> ChatSocket:
        headers = {"Origin": f"http://{HOST}:{self.port}", "Cookie": self.cookie}
        return await asyncio.wait_for(ChatSocket.connect(self.port, "/ws/chat/", headers), 30)

    async def turn(self, sock: ChatSocket, result: TurnResult, content: str, seed: int) -> None:
        """Send one message and read frames until `done` or `error`, filling in `result`."""
        frame: dict = {
            "type": "message",
            "conversation": result.conversation,
            "content": content,
            "seed": seed,
        }
        if result.conversation is None:
            # NOTE: passed explicitly, so the bench changes no defaults of the database.
            frame |= {"profile": self.profile_id, "collections": self.collection_ids}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.turn_timeout_s
        sent = time.perf_counter()
        sock.send_json(frame)
        while True:
            item = await sock.next_frame(deadline, self.turn_timeout_s)
            kind = item.get("type")
            if kind == "token":
                if result.ttft_s is None:
                    result.ttft_s = time.perf_counter() - sent
                result.token_frames += 1
            elif kind == "start":
                result.conversation = item["conversation"]["id"]
            elif kind == "sources":
                result.num_sources = len(item["sources"])
            elif kind == "done":
                result.total_s = time.perf_counter() - sent
                result.stats = item["message"]["stats"]
                result.finish_reason = item["message"]["finish_reason"]
                result.answer = item["message"]["content"]
                return
            elif kind == "error":
                result.error = {"code": item.get("code"), "message": item.get("message")}
                return

    async def chat(self, index: int, turns: int, results: list[TurnResult]) -> None:
        """One chat of `turns` turns on its own socket; stops at the first failed turn."""
        conversation = None
        try:
            sock = await self.connect()
        except (OSError, ConnectionError, TimeoutError) as error:
            results.append(TurnResult(index, 1, error={"code": "connect", "message": str(error)}))
            return
        try:
            for turn in range(1, turns + 1):
                result = TurnResult(index, turn, conversation=conversation)
                results.append(result)
                await self.turn(sock, result, question(index, turn), seed=index * 1000 + turn)
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
            raise BenchError(f"could not open the chat socket: {error}") from error
        warm = TurnResult(-1, 1)
        try:
            await client.turn(sock, warm, WARMUP_QUESTION, seed=0)
        finally:
            await sock.close()
        if warm.error is not None:
            raise BenchError(f"the warm-up turn failed: {warm.error}")
    results: list[TurnResult] = []
    started = time.perf_counter()

    async def start(index: int) -> None:
        await asyncio.sleep(ramp_s * index / max(chats - 1, 1))
        await client.chat(index, turns, results)

    await asyncio.gather(*(start(index) for index in range(chats)))
    return results, warm, time.perf_counter() - started


# --- The report ---


def rounded(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(float(value), digits)


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


def counts(values) -> dict[str, int]:
    """How often each value occurs, keyed by its string (finish reasons, for the report)."""
    found: dict[str, int] = {}
    for value in values:
        found[str(value)] = found.get(str(value), 0) + 1
    return found


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
            spec = {"max_tokens": max_tokens, "top_k": top_k, "with_documents": with_documents}
            site = server.call("bench.chat:prepare_site", spec, timeout=SITE_COMMAND_TIMEOUT_S)
            setup_s = time.perf_counter() - began
            logger.info("site ready in %.1fs (chat model %s)", setup_s, site["chat_model_action"])
            began = time.perf_counter()
            try:
                server.start()
                startup_s = time.perf_counter() - began
                logger.info("server ready in %.1fs on %s", startup_s, server.url)
                client = ChatClient(
                    port=server.port,
                    cookie=f"{site['cookie_name']}={site['session']}",
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
                        server.call("bench.chat:cleanup_site", site)
                    except LiveServerError as error:
                        logger.warning("could not remove the bench's rows: %s", error)
    except LiveServerError as error:
        raise BenchError(str(error)) from None

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


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run_cli(
    run: Callable[[], dict],
    *,
    as_json: bool,
    format_report: Callable[[dict], str],
    num_errors: Callable[[dict], int],
) -> int:
    """Run a benchmark and print its report (JSON or a table); the exit status.

    0: done, 1: done but requests failed, 2: it could not run (`BenchError`), 130: interrupted
    (SIGTERM too, so `kill` still stops the benchmark's server).
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        report = run()
    except BenchError as error:
        logger.error("%s", error)
        return 2
    except KeyboardInterrupt:
        logger.error("interrupted; the server was stopped")
        return 130
    if as_json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(format_report(report) + "\n")
    return 1 if num_errors(report) else 0


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
