"""Tests of the engine (inference/engine/), one folder per package of it."""
