"""A WebSocket client for Cachet's sockets (`/ws/chat/`, `/ws/documents/<id>/progress/`).

`ChatSocket` speaks just enough RFC 6455 for a test or a benchmark: JSON text frames in and out,
ping/pong, close. Received frames land in `ChatSocket.frames`, and `CLOSED` follows the last one.
`open_chat` opens the chat socket as a logged-in browser would (origin and session cookie).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import secrets

HOST = "127.0.0.1"
CONNECT_TIMEOUT_S = 30.0
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


async def open_chat(port: int, cookie: str, timeout_s: float = CONNECT_TIMEOUT_S) -> ChatSocket:
    """The chat socket of the server on `port`, logged in with `cookie` ("sessionid=...")."""
    headers = {"Origin": f"http://{HOST}:{port}", "Cookie": cookie}
    return await asyncio.wait_for(ChatSocket.connect(port, "/ws/chat/", headers), timeout_s)
