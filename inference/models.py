"""Models of the inference app."""
