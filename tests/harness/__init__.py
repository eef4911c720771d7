"""Tests of the shared tooling (harness/): the import-cycle check, the chat client."""
