"""Reliability suites against a live Cachet server: load, KV pressure, client disconnects.

Each suite is a module runnable as `python -m reliability.<suite> --json` (size flags per suite;
`--help` lists them). It starts a real server (`harness.live_server.LiveServer`), drives it over
loopback, computes a list of checks and exits with status 1 if any check failed (2 if it could not
run at all). The results and the commands that reproduce them are in docs/reliability.md.
"""
