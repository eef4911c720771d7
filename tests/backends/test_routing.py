"""backends.routing: the documented rules one by one, and the remote model of complex turns."""

from __future__ import annotations

import pytest

from backends.models import InferenceBackend
from backends.routing import (
    AUTO_MODEL,
    ProfileRouting,
    RoutingPolicy,
    TurnShape,
    UnknownModelError,
    choose_route,
    complex_model_of,
)

LOCAL = "SmolLM2-135M-Instruct"
BIG = "Qwen2.5-72B-Instruct"
POLICY = RoutingPolicy(
    local_model=LOCAL,
    remote_models=[BIG, "coder"],
    complex_model=BIG,
    long_prompt_chars=1000,
    many_passages=4,
)
SHORT = TurnShape(prompt_chars=100, num_passages=1)


def route_of(shape: TurnShape, policy: RoutingPolicy = POLICY) -> tuple[str, bool, str, bool]:
    route = choose_route(shape, policy)
    return route.model, route.is_remote, route.reason, route.may_fall_back


def test_a_short_turn_with_few_passages_stays_local() -> None:
    assert route_of(SHORT) == (LOCAL, False, "short", False)


def test_a_long_prompt_goes_to_the_remote_model_and_may_fall_back() -> None:
    assert route_of(TurnShape(prompt_chars=1000)) == (BIG, True, "long_prompt", True)
    assert route_of(TurnShape(prompt_chars=999))[2] == "short"


def test_many_retrieved_passages_go_to_the_remote_model() -> None:
    assert route_of(TurnShape(prompt_chars=10, num_passages=4)) == (
        BIG,
        True,
        "many_passages",
        True,
    )
    assert route_of(TurnShape(prompt_chars=10, num_passages=3))[2] == "short"


def test_an_explicit_model_wins_over_every_rule_and_never_falls_back() -> None:
    long_turn = TurnShape(prompt_chars=50_000, num_passages=20)
    assert route_of(TurnShape(requested_model=LOCAL, prompt_chars=50_000)) == (
        LOCAL,
        False,
        "explicit",
        False,
    )
    chosen = TurnShape(requested_model="coder", profile_routing=ProfileRouting.LOCAL)
    assert route_of(chosen) == ("coder", True, "explicit", False)
    assert route_of(TurnShape(requested_model=AUTO_MODEL, prompt_chars=5000))[2] == "long_prompt"
    assert route_of(long_turn)[2] == "long_prompt"


def test_an_unknown_model_is_refused_with_the_models_served() -> None:
    with pytest.raises(UnknownModelError, match="`gpt-5` does not exist.*coder"):
        choose_route(TurnShape(requested_model="gpt-5"), POLICY)


def test_the_profile_setting_comes_before_the_size_rules() -> None:
    local_profile = TurnShape(profile_routing=ProfileRouting.LOCAL, prompt_chars=50_000)
    assert route_of(local_profile) == (LOCAL, False, "profile", False)
    remote_profile = TurnShape(profile_routing=ProfileRouting.REMOTE, prompt_chars=1)
    assert route_of(remote_profile) == (BIG, True, "profile", True)


def test_without_a_remote_model_for_complex_turns_everything_stays_local() -> None:
    policy = RoutingPolicy(local_model=LOCAL, remote_models=["coder"], complex_model=None)
    remote_profile = TurnShape(profile_routing=ProfileRouting.REMOTE, prompt_chars=50_000)
    assert route_of(remote_profile, policy) == (LOCAL, False, "no_remote", False)
    assert route_of(TurnShape(requested_model="coder"), policy)[:2] == ("coder", True)


def test_complex_turns_go_to_the_marked_model_with_the_most_total_weight() -> None:
    def backend(model: str, weight: int = 1, **fields) -> InferenceBackend:
        return InferenceBackend(name=f"{model}-{weight}", model=model, weight=weight, **fields)

    assert complex_model_of([]) is None
    pools = [backend("a", 2), backend("b", 1), backend("b", 2), backend("c", 9, is_enabled=False)]
    assert complex_model_of(pools) == "b"  # 3 against 2; the disabled one does not count
    assert complex_model_of([backend("z"), backend("y")]) == "y"  # a tie: the first by name
    unmarked = backend("big", 50, takes_complex_requests=False)
    assert complex_model_of([unmarked, backend("small")]) == "small"
    assert complex_model_of([unmarked]) is None
