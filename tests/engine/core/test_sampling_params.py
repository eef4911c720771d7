"""SamplingParams: defaults, normalisation and clear errors for bad values."""

from __future__ import annotations

import pytest

from inference.engine.core.sampling_params import SamplingParams


def test_defaults_are_valid_and_not_greedy():
    params = SamplingParams()
    assert not params.is_greedy
    assert params.stop == ()
    assert not params.has_penalties


def test_a_single_stop_string_becomes_a_tuple():
    assert SamplingParams(stop="\n\n").stop == ("\n\n",)
    assert SamplingParams(stop=["a", "b"], stop_token_ids=[2, 3]).stop_token_ids == (2, 3)


def test_temperature_zero_is_greedy():
    assert SamplingParams(temperature=0).is_greedy


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": -0.1}, "temperature must be >= 0"),
        ({"temperature": "hot"}, "temperature must be a number"),
        ({"temperature": float("nan")}, "temperature must be finite"),
        ({"top_p": 0}, r"top_p must be in \(0, 1\]"),
        ({"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
        ({"top_k": 0}, "top_k must be >= 1"),
        ({"top_k": 2.5}, "top_k must be an integer"),
        ({"seed": -1}, "seed must be in"),
        ({"max_tokens": 0}, "max_tokens must be >= 1"),
        ({"max_tokens": True}, "max_tokens must be an integer"),
        ({"stop": [""]}, "stop strings must be non-empty"),
        ({"stop": 5}, "stop must be a string or a list"),
        ({"stop_token_ids": [-3]}, "stop_token_ids must be non-negative"),
        ({"presence_penalty": 2.5}, r"presence_penalty must be in \[-2, 2\]"),
        ({"frequency_penalty": -3}, r"frequency_penalty must be in \[-2, 2\]"),
        ({"ignore_eos": "yes"}, "ignore_eos must be True or False"),
    ],
)
def test_bad_values_raise_value_error_naming_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)
