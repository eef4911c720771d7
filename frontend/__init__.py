"""The browser UI: the chat page and its ES modules, log-in, a document's text (no build step)."""
