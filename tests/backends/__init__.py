"""Tests of backends/: remote OpenAI-compatible backends, their health, replicas and routing."""
