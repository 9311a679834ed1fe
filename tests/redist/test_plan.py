"""Building a redist.Plan by hand: every inconsistency is a ShardingError naming the part (it was an
AssertionError, or an AttributeError from inside a step)."""

import pytest

from redist import Mesh, Plan, ShardingError, ShardingType
from redist.steps import AllGather, AllSlice

MESH = Mesh({"x": 2, "y": 4})
SRC = ShardingType.parse("f32[8{x}, 8]", MESH)
MID = ShardingType.parse("f32[8, 8]", MESH)
DST = ShardingType.parse("f32[8, 8{y}]", MESH)


def test_a_consistent_plan_is_accepted_and_holds_tuples():
    plan = Plan([AllGather(0, ("x",)), AllSlice(1, ("y",))], [SRC, MID, DST])
    assert plan.steps == (AllGather(0, ("x",)), AllSlice(1, ("y",))) and plan.types == (SRC, MID, DST)
    assert plan.src == SRC and plan.dst == DST and hash(plan) == hash(Plan(plan.steps, plan.types))


@pytest.mark.parametrize("steps, types, match", [
    ((), (), "a plan of 0 steps needs 1 types .* got 0"),
    ((AllGather(0, ("x",)),), (SRC,), "a plan of 1 steps needs 2 types"),
    ((AllGather(0, ("x",)),), (SRC, DST), r"step 0 of the plan, all_gather\(dim 0, \{x\}\), turns f32\[8\{x\}, 8\] "
                                          r"into f32\[8, 8\], not into f32\[8, 8\{y\}\]"),
    ((AllGather(1, ("x",)),), (SRC, MID), r"\{x\} is not the minor end of dim 1"),
    (("all_gather",), (SRC, MID), "step 0 of the plan is no redist step: str 'all_gather'"),
    ((), ("f32[8]",), "type 0 of the plan is no redist.ShardingType: str 'f32\\[8\\]'"),
    ("steps", (SRC,), "Plan steps must be a tuple, got str"),
    ((), None, "Plan types must be a tuple, got NoneType"),
])
def test_an_inconsistent_plan_is_refused(steps, types, match):
    with pytest.raises(ShardingError, match=match):
        Plan(steps, types)
