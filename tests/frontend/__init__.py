"""Tests of the browser UI (frontend/): pages, hashed ES modules, Chromium driven by Playwright."""
