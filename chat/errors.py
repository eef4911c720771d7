"""The error a client gets for a turn or a frame, with its protocol code (docs/chat-protocol.md)."""


class ChatError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
