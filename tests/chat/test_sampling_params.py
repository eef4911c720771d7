"""chat.turn.sampling_params_for: the profile's sampling settings, else the model config's."""

from __future__ import annotations

from chat.models import AssistantProfile
from chat.turn import sampling_params_for
from inference.models import ModelConfig


def test_profile_settings_win_and_empty_ones_fall_back_to_the_model_configuration():
    profile = AssistantProfile(name="p", temperature=0.0, max_tokens=32)
    config = ModelConfig(name="c", temperature=0.7, top_p=0.8, top_k=40, max_tokens=512)
    params = sampling_params_for(profile, config, seed=3)
    assert (params.temperature, params.max_tokens) == (0.0, 32)
    assert (params.top_p, params.top_k, params.seed) == (0.8, 40, 3)


def test_every_answer_gets_a_seed_so_it_can_be_reproduced():
    params = sampling_params_for(AssistantProfile(name="p"), ModelConfig(name="c"))
    assert isinstance(params.seed, int) and 0 <= params.seed < 2**31
