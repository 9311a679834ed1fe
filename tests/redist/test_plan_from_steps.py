"""``Plan.from_steps``: a plan from a source type and steps, each step typed by its own rule."""

import json

import pytest
from hypothesis import given, settings

from redist import Mesh, Plan, ShardingError, ShardingType, synthesize
from redist.plan_file import FORMAT, step_args
from redist.steps import (AllGather, AllReduce, AllSlice, AllToAll, Exchange, MultiAllToAll, Pad, Permute,
                          ReduceScatter, ReplicateToPartial, ShardToPartial, Unpad)
from tests.redist.strategies import type_pairs

MESH = Mesh({"x": 2, "y": 4})


def _t(text: str) -> ShardingType:
    return ShardingType.parse(text, MESH)


def test_types_are_folded_by_each_steps_rule():
    src = _t("f32[16{x}, 16] partial{y}")
    steps = [AllReduce(("y",)), AllToAll(0, 1, ("x",)), AllSlice(0, ("y",))]
    plan = Plan.from_steps(src, iter(steps))  # any iterable of steps
    assert plan.steps == tuple(steps)
    assert plan.types == (src, _t("f32[16{x}, 16]"), _t("f32[16, 16{x}]"), _t("f32[16{y}, 16{x}]"))
    local = 8 * 16 * 4
    assert plan.step_bytes() == (2 * 3 * local // 4, local // 2, 0)


def test_no_steps_is_the_plan_from_a_type_to_itself():
    src = _t("f32[8{x}, 4] partial{y}")
    plan = Plan.from_steps(src, ())
    assert plan.types == (src,) and plan.steps == () and plan.bytes_received == 0
    assert plan.src == plan.dst == src


@given(type_pairs(max_rank=3))
@settings(max_examples=60, deadline=None)
def test_a_synthesized_plan_is_the_plan_of_its_steps(pair):
    """Synthesis builds its plans with ``from_steps``, which applies each step once: the constructor's whole check
    (every step applied again, its type compared) accepts what it built."""
    plan = synthesize(*pair)
    assert Plan.from_steps(plan.src, plan.steps) == plan
    assert Plan(plan.steps, plan.types) == plan


def test_collectives_on_two_device_orders_are_refused():
    """``from_steps`` checks what the constructor checks besides the steps' types: a plan whose collectives run
    on two device orders is refused; a permute to another order before them is a plan."""
    src, reverse = _t("f32[16{x}, 16]"), (7, 6, 5, 4, 3, 2, 1, 0)
    plan = Plan.from_steps(src, [Permute((("x",), ()), reverse), AllGather(0, ("x",))])
    assert plan.dst.mesh != src.mesh and Plan(plan.steps, plan.types) == plan
    with pytest.raises(ShardingError, match="device orders"):
        Plan.from_steps(src, [AllSlice(1, ("y",)), Permute((("x",), ("y",)), reverse), AllGather(0, ("x",))])


def test_a_step_that_does_not_fit_is_named_with_its_position_and_the_type():
    src = _t("f32[16{x}, 16]")
    bad = AllGather(0, ("y",))
    with pytest.raises(ShardingError) as info:
        Plan.from_steps(src, [AllToAll(0, 1, ("x",)), bad])
    message = str(info.value)
    assert "step 1 of 2" in message and str(bad) in message and "f32[16, 16{x}]" in message


@pytest.mark.parametrize("src, steps, match", [
    ("f32[8{x}]", [], r"src must be a redist.ShardingType, got str 'f32\[8\{x\}\]'"),
    (_t("f32[8{x}]"), None, "steps must be a sequence of steps of redist.steps, got NoneType None"),
    (_t("f32[8{x}]"), Pad(), "steps must be a sequence of steps of redist.steps, got Pad"),
    (_t("f32[8{x}]"), "all_gather", "steps must be a sequence of steps of redist.steps, got str"),
    (_t("f32[8{x}]"), [AllGather(0, ("x",)), "permute"], "step 1 is str 'permute', not a step of redist.steps"),
    (_t("f32[8{x}, 8]"), [Permute(((), ("x",), ()))], r"step 0 of 1: permute\(to \[\{\}, \{x\}, \{\}\]\) does not "
                                                       "fit f32\\[8\\{x\\}, 8\\]: it names 3 dims"),
])
def test_what_is_not_a_type_or_steps_raises_a_sharding_error(src, steps, match):
    with pytest.raises(ShardingError, match=match):
        Plan.from_steps(src, steps)


@pytest.mark.parametrize("src, step, axes", [
    ("f32[8] partial{y}", AllReduce(("y", "y")), "{y,y}"),
    ("f32[8] partial{y}", AllReduce(("y", "y:(2)2")), "{y,y:(2)2}"),
    ("f32[8] partial(max){y}", AllReduce(("y:(1)2", "y:(2)2", "y:(1)2"), "max"), "{y:(1)2,y:(2)2,y:(1)2}"),
    ("f32[8] partial{y}", ReduceScatter(0, ("y", "y:(1)2")), "{y,y:(1)2}"),
    ("f32[8]", AllSlice(0, ("y", "y")), "{y,y}"),
    ("f32[8{y}]", AllGather(0, ("y:(2)2", "y:(2)2")), "{y:(2)2,y:(2)2}"),
    ("f32[8{y}, 8]", AllToAll(0, 1, ("y", "y")), "{y,y}"),
    ("f32[8{y}, 8, 8]", MultiAllToAll(((0, 1, ("y",)), (2, 1, ("y:(2)2",)))), "{y,y:(2)2}"),
    ("f32[8]", ReplicateToPartial(("x", "x")), "{x,x}"),
    ("f32[8{y}]", ShardToPartial(0, ("y", "y")), "{y,y}"),
    ("f32[8{y}]", Permute((("y", "y"),)), "'y' used twice"),
    ("f32[8{y}]", Exchange((("y", "y:(2)2"),)), "'y' and 'y:(2)2' overlap"),
])
def test_a_step_that_names_an_axis_twice_or_overlapping_axes_is_refused(src, step, axes):
    """A step's axes define its groups of devices: an axis named twice, or two that overlap, define none, and
    the step's typing rule refuses it (naming the step and the axes), whatever the type, as the verifier does."""
    with pytest.raises(ShardingError) as info:
        Plan.from_steps(_t(src), [step])
    message = str(info.value)
    assert "step 0 of 1" in message and str(step) in message and axes in message, message
    assert any(why in message for why in ("named twice", "overlap", "used twice")), message


def _file(src: ShardingType, steps) -> tuple[str, tuple]:
    """A plan file with only the fields the reader requires, for steps that make no plan, and their types."""
    types = [src]
    for step in steps:
        types.append(step.apply(types[-1]))
    return json.dumps({"format": FORMAT, "mesh": str(src.mesh), "src": str(src), "dst": str(types[-1]),
                       "steps": [{"kind": s.kind, "args": step_args(s)} for s in steps]}), tuple(types)


@pytest.mark.parametrize("src, steps, reason", [
    (_t("f32[7{y}]"), [Pad(), Unpad((5,))], "source shape [7] differs from destination shape [5]"),
    (_t("f32[8] partial(max){x}"), [AllReduce(("x",), "max"), ReplicateToPartial(("x",))],
     "cannot convert between reduction kinds"),
    (ShardingType.parse("f32[6{z:(1)2}]", Mesh({"z": 6})), [AllGather(0, ("z:(1)2",)), AllSlice(0, ("z:(3)2",))],
     "not factors of one decomposition"),
])
def test_steps_that_are_no_redistribution_are_refused_however_the_plan_is_built(src, steps, reason):
    """Each step fits, but the plan changes the array's shape or its reduction kind, or uses sub-axes of no one
    factorization: no redistribution. ``from_steps``, the constructor and ``from_json`` refuse it alike."""
    text, types = _file(src, steps)
    for build in (lambda: Plan.from_steps(src, steps), lambda: Plan(tuple(steps), types),
                  lambda: Plan.from_json(text)):
        with pytest.raises(ShardingError) as info:
            build()
        message = str(info.value)
        assert f"turn {src} into {types[-1]}, which is no redistribution of it" in message and reason in message
    with pytest.raises(ShardingError, match=r"^plan file: the steps turn"):
        Plan.from_json(text)
