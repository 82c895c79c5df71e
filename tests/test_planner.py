"""One planner: ``all_reduce(algorithm="auto")`` and the closed loop choose alike, with the same
model; with a fitted model that disagrees with the default one, ``auto`` follows the fitted one.
The two multi-rank runs share one process group (tests/_launch.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import planner_bodies
import pytest
from _launch import Case
from _launch import launches as launched

from stragglerkit.planner import DEFAULT_PRIOR, CompiledPlan, Predictor, Situation, choose, compile_plan
from stragglerkit.planner.remap import RankMap

CASES: dict[str, Case] = {
    # case: (world size, (its test, its parameters), its body in tests/planner_bodies.py, its arguments)
    "auto": (
        planner_bodies.WORLD,
        ("test_all_reduce_auto_chooses_as_the_loop_does_with_the_same_model", ""),
        planner_bodies.auto_choices,
        (),
    ),
    "fitted": (
        planner_bodies.WORLD,
        ("test_the_loop_hands_its_fitted_model_to_every_ranks_auto", ""),
        planner_bodies.fitted_model_adopted,
        (16,),
    ),
}


@pytest.fixture(scope="module")
def launches(request: pytest.FixtureRequest) -> Callable[[str], dict[int, Any]]:
    """``launches(case)``: {rank: what the case's body returned}, both cases from one process group."""
    return launched(request, CASES, timeout=600.0)


def test_the_fitted_model_chooses_otherwise_than_the_default_one() -> None:
    situation = Situation(world_size=planner_bodies.WORLD, slowdowns=planner_bodies.SLOWDOWNS)
    nbytes = planner_bodies.NUMEL * 4
    model = planner_bodies.fitted_model()
    assert model.fit_info["fitted"] and model.config.beta > 5 * DEFAULT_PRIOR.beta  # a slower cluster
    default = choose(situation, nbytes, Predictor(planner_bodies.WORLD), min_gain=0.05).algorithm
    fitted = choose(situation, nbytes, model, min_gain=0.05).algorithm
    assert default != fitted, "the two models must disagree, or the test below proves nothing"
    # the controller's rule is the planner's, model for model
    assert planner_bodies.loop_choice(Predictor(planner_bodies.WORLD)) == default
    assert planner_bodies.loop_choice(model) == fitted


def test_all_reduce_auto_chooses_as_the_loop_does_with_the_same_model(
    launches: Callable[[str], dict[int, Any]],
) -> None:
    results = launches("auto")
    first = results[0]
    assert all(r == first for r in results.values()), results  # every rank ran the same
    assert first["correct"]
    assert first["default"] != first["fitted"], first
    assert first["default"] == first["loop_default"]
    assert first["fitted"] == first["loop_fitted"]


def test_a_compiled_plan_is_frozen_and_hashable_by_its_key() -> None:
    situation = Situation(world_size=8, straggler=7)
    one = compile_plan("stragglar", situation, 1000, 4, RankMap.identity(8), 3)
    two = compile_plan("stragglar", situation, 1000, 4, RankMap.identity(8), 3)
    assert isinstance(one, CompiledPlan) and one == two and hash(one) == hash(two) and len({one, two}) == 1
    assert one.plan_id == two.plan_id and one.algorithm == "stragglar" and one.rank == 3
    other = compile_plan("stragglar", situation, 1000, 4, RankMap.identity(8), 4)
    assert other != one


def test_the_loop_hands_its_fitted_model_to_every_ranks_auto(launches: Callable[[str], dict[int, Any]]) -> None:
    results = launches("fitted")
    first = results[0]
    assert first["fitted_on_rank0"], "rank 0's controller fitted no model: the test proves nothing"
    assert first["params"] is not None, "the fitted model never reached the runtime"
    assert first["params"] != dataclasses.astuple(DEFAULT_PRIOR)
    assert all(r["params"] == first["params"] for r in results.values()), results  # one model everywhere
    assert all(r["auto"] == first["auto"] and r["correct"] for r in results.values()), results
    assert first["auto"] == first["planner"]  # auto chose as the planner does with the fitted model
