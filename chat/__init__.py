"""Conversations and the chat turn: events, the answer loop, the message-level prompt, sockets."""
