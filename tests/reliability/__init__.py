"""The reliability suites (reliability/) and the fault tests: kills, outages, reloads, pressure."""
