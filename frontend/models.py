"""Models of the frontend app."""
