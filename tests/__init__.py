"""The test suite, one folder per package; fixtures in conftest.py (shared ones at this level)."""
