"""The inference app: the in-process language model engine and its Django configuration."""
