"""Plans as files (docs/spec.md §3): ``Plan.from_json(plan.to_json())`` gives the plan back for every step kind, the
loaded plan is proved by ``verify``, and a corrupted or hand-edited file raises ShardingError naming the field:
a loaded plan never disagrees with its file, and nothing else escapes the reader."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from redist import Mesh, Plan, ShardingError, ShardingType, synthesize, verify
from redist import steps as S
from redist.plan_file import FORMAT, file_text
from redist.testing import SeededDraw, draw_mesh, draw_pair
from redist.types import REDUCTIONS

MESH = Mesh({"x": 4, "y": 2})
KINDS = {"all_slice", "all_gather", "all_to_all", "permute", "reduce_scatter", "all_reduce", "exchange", "pad",
         "unpad", "replicate_to_partial", "shard_to_partial"}


def _plan(src: str, dst: str, mesh: Mesh = MESH) -> Plan:
    return synthesize(ShardingType.parse(src, mesh), ShardingType.parse(dst, mesh))


def _sample_plans(n: int = 160, seed: int = 3) -> list[Plan]:
    """Seeded random plans (sub-axes, partial sources of every reduction kind, uneven dims, device orders,
    complex dtypes, created pending sums) on meshes of up to 16 devices."""
    draw = SeededDraw(seed)
    plans = []
    while len(plans) < n:
        mesh = draw_mesh(draw, max_axes=3, max_devices=16, min_devices=2, device_order=0.2)
        src, dst = draw_pair(draw, mesh, max_rank=3, partial=0.4, sub_axes=0.3, uneven=0.4,
                             dtype=("f32", "f32", "c64", "i32"), reductions=REDUCTIONS, reorder=0.2, create=0.2)
        plans.append(synthesize(src, dst))
    return plans


# Multi-move all-to-alls are rare in random plans, and any one reduction kind may be missing: plans built step
# by step that have them.
PLANS = _sample_plans() + [
    Plan.from_steps(ShardingType.parse("f32[8{x}, 8, 8{y}]", MESH),
                    [S.MultiAllToAll(((0, 1, ("x",)), (2, 1, ("y",))))]),
    *(Plan.from_steps(ShardingType.parse(f"f32[8, 4] partial({kind}){{x,y}}", MESH),
                      [S.ReduceScatter(0, ("x",), kind), S.AllReduce(("y",), kind)]) for kind in REDUCTIONS),
]


def test_the_sample_has_every_step_kind_and_a_multi_move_all_to_all():
    """So that the round trip below covers every constructor the reader uses."""
    steps = [s for p in PLANS for s in p.steps]
    assert {s.kind for s in steps} == KINDS
    assert any(s.kind == "all_to_all" and len(s.moves) > 1 for s in steps if hasattr(s, "moves"))
    assert {s.reduction for s in steps if s.kind in ("reduce_scatter", "all_reduce")} == set(REDUCTIONS)
    assert any(p.dst.mesh != p.src.mesh for p in PLANS)  # a change of device order: the file has dst_mesh


@pytest.mark.parametrize("i", range(len(PLANS)))
def test_round_trip_gives_the_same_plan(i):
    plan = PLANS[i]
    assert Plan.from_json(plan.to_json()) == plan
    assert Plan.from_json(file_text(plan)) == plan
    assert Plan.from_json(plan.to_json().encode()) == plan


def test_a_loaded_plan_is_proved():
    for plan in PLANS[:40]:
        loaded = Plan.from_json(file_text(plan))
        v = verify(loaded)
        assert v.status == "proved", (plan, v.reason)


def test_the_file_format():
    """The fields docs/spec.md §3 names, the args each step is rebuilt from, one line per step in the file text."""
    plan = _plan("f32[16{y}, 16, 16{x}]", "f32[16, 16{x,y}, 16]")
    data = json.loads(plan.to_json())
    assert data == {
        "format": FORMAT, "mesh": "x=4,y=2", "src": "f32[16{y}, 16, 16{x}]", "dst": "f32[16, 16{x,y}, 16]",
        "steps": [{"kind": "all_to_all", "args": {"moves": [[2, 1, ["x"]], [0, 1, ["y"]]]},
                   "step": "all_to_all(dim 2 -> dim 1 {x}, dim 0 -> dim 1 {y})", "type": "f32[16, 16{x,y}, 16]",
                   "bytes_received": 1792}],
        "peak_bytes": 2048, "bytes_received": 1792, "memory_bound_bytes": 2048, "lower_bound_bytes": 1792}
    lines = file_text(plan).splitlines()
    assert lines[6].startswith('    {"kind": "all_to_all"') and len(lines) == 13
    assert json.loads(file_text(plan)) == data


def test_derived_fields_are_optional():
    """A hand-written file needs only the format, mesh, src, dst and each step's kind and args."""
    plan = _plan("f32[8{x}, 4{y}]", "f32[8{y}, 4]")
    data = json.loads(plan.to_json())
    bare = {k: data[k] for k in ("format", "mesh", "src", "dst")}
    bare["steps"] = [{"kind": s["kind"], "args": s["args"]} for s in data["steps"]]
    assert Plan.from_json(json.dumps(bare)) == plan


# A plan with several kinds of step: pad, reduce_scatter, unpad, exchange (built step by step, so that it does
# not change with the synthesizer's choices).
BASE = Plan.from_steps(ShardingType.parse("f32[5{x}, 4] partial{y}", MESH),
                       [S.Pad(), S.ReduceScatter(0, ("y",)), S.Unpad((5, 4)), S.Exchange(((), ("x",)))])


def _edited(edit) -> str:
    data = json.loads(BASE.to_json())
    edit(data)
    return json.dumps(data)


def _set_args(i, **args):
    return lambda d: d["steps"][i]["args"].update(args)


@pytest.mark.parametrize("text, message", [
    ("{", "plan file: not JSON (Expecting property name"),
    ("[" * 100_000, "plan file: not JSON"),
    ('{"format": 1' + "0" * 5000 + "}", "plan file: not JSON (Exceeds the limit"),
    ("[]", "plan file: the plan must be a JSON object, got []"),
    (_edited(lambda d: d.update(format="redist.plan/0")), "format is 'redist.plan/0', this version of redist reads"),
    (_edited(lambda d: d.pop("steps")), "plan file: the plan has no steps"),
    (_edited(lambda d: d.update(stpes=[])), "the plan has fields this format does not know: stpes"),
    (_edited(lambda d: d.update(mesh="x=4")), "plan file: src: unknown mesh axis 'y'"),
    (_edited(lambda d: d.update(mesh="x=2²")), "plan file: mesh: cannot read mesh axis"),
    (_edited(lambda d: d.update(src="f32[5{x}, 4]")), "plan file: step 0 (pad): pad turns f32[5{x}, 4] into "
                                                       "f32[8{x}, 4], but the file says type f32[8{x}, 4] partial{y}"),
    (_edited(lambda d: d.update(dst="f32[5, 4{y}]")), "the steps end at f32[5, 4{x}], but dst is f32[5, 4{y}]"),
    (_edited(lambda d: d.update(steps={})), "steps must be a list of steps, got {}"),
    (_edited(lambda d: d["steps"].pop(3)), "the steps end at f32[5{x,y}, 4], but dst is f32[5, 4{x}]"),
    (_edited(lambda d: d["steps"].reverse()), "plan file: step 0 (exchange): exchange(to [{}, {x}]) turns f32[5{x}, 4] "
                                          "partial{y} into f32[5, 4{x}] partial{y}, but the file says type f32[5, 4{x}]"),
    (_edited(lambda d: d["steps"][1].update(kind="all_reduce")), "step 1 (all_reduce): args must be an object with "
                                                                 "the fields {axes, reduction}"),
    (_edited(lambda d: d["steps"][1].update(kind="all_to_al")), "step 1: unknown kind 'all_to_al'; the kinds are"),
    (_edited(lambda d: d["steps"][1].pop("args")), "plan file: step 1 has no args"),
    (_edited(lambda d: d["steps"][1].update(note="x")), "step 1 has fields this format does not know: note"),
    (_edited(lambda d: d["steps"].__setitem__(1, "reduce_scatter")), "step 1 must be a JSON object"),
    (_edited(_set_args(1, dim=True)), "step 1 (reduce_scatter): dim must be an integer, got True"),
    (_edited(_set_args(1, dim=7)), "reduce_scatter(dim 7, {y}) does not fit f32[8{x}, 4] partial{y}: the array "
                                   "has no dim 7"),
    (_edited(_set_args(1, axes="y")), "step 1 (reduce_scatter): axes must be a list of mesh axis names, got 'y'"),
    (_edited(_set_args(1, axes=["x"])), "{x} are not all partial axes"),
    (_edited(_set_args(1, reduction="mean")), "step 1 (reduce_scatter): reduction must be one of sum, max, min, "
                                              "prod, got 'mean'"),
    (_edited(_set_args(1, reduction="max")), "step 1 (reduce_scatter): reduce_scatter(max, dim 0, {y}) does not "
                                             "fit f32[8{x}, 4] partial{y}: it takes the max of the group, but the "
                                             "pending reduction is a sum"),
    (_edited(_set_args(3, device_ids=[0, 1])), "step 3 (exchange)"),
    (_edited(_set_args(3, device_ids="0,1")), "step 3 (exchange): device_ids must be null or a list of device ids"),
    (_edited(lambda d: d.update(dst_mesh="x=4,y=2,device_ids=[7,6,5,4,3,2,1,0]")), "the steps end at f32[5, 4{x}]"),
    (_edited(_set_args(2, shape=[9, 4])), "step 2 (unpad): unpad(to [9, 4]) does not fit f32[8{x,y}, 4]: its padded "
                                       "shape is [16, 4], not [8, 4]"),
    (_edited(_set_args(2, shape=[6, 4])), "step 2 (unpad): step is 'unpad(to [5, 4])', but the steps give "
                                          "'unpad(to [6, 4])'"),
    (_edited(_set_args(2, shape=[5, "4"])), "step 2 (unpad): shape[1] must be an integer, got '4'"),
    (_edited(_set_args(3, dims=[["x"]])), "exchange(to [{x}]) does not fit f32[5{x,y}, 4]: it names 1 dims"),
    (_edited(_set_args(3, dims=[[], [3]])), "step 3 (exchange): dims[1] must be a list of mesh axis names"),
    (_edited(lambda d: d["steps"][3].update(type="f32[5, 4{y}]")), "exchange(to [{}, {x}]) turns f32[5{x,y}, 4] "
                                                                   "into f32[5, 4{x}], but the file says type "
                                                                   "f32[5, 4{y}]"),
    (_edited(lambda d: d["steps"][3].update(type="f32[5, 4{q}]")), "step 3 (exchange): type: unknown mesh axis 'q'"),
    (_edited(lambda d: d["steps"][3].update(step="exchange(to [{x}, {}])")), "step 3 (exchange): step is "
                                                                            "'exchange(to [{x}, {}])', but the steps "
                                                                            "give 'exchange(to [{}, {x}])'"),
    (_edited(lambda d: d["steps"][1].update(bytes_received=0)), "step 1 (reduce_scatter): bytes_received is 0, but"),
    (_edited(lambda d: d["steps"][0].update(bytes_received=False)), "step 0 (pad): bytes_received is False, but the "
                                                                    "steps give 0"),
    (_edited(lambda d: d.update(peak_bytes=1)), "plan file: peak_bytes is 1, but the steps give 32"),
    (_edited(lambda d: d.update(bytes_received=1)), "plan file: bytes_received is 1, but the steps give"),
    (_edited(lambda d: d.update(lower_bound_bytes=1)), "plan file: lower_bound_bytes is 1, but the steps give"),
    (_edited(lambda d: d.update(memory_bound_bytes=1)), "plan file: memory_bound_bytes is 1, but the steps give"),
])
def test_a_corrupted_file_names_the_field(text, message):
    with pytest.raises(ShardingError) as e:
        Plan.from_json(text)
    assert str(e.value).startswith("plan file: ") and message in str(e.value), str(e.value)


def test_the_base_file_has_the_steps_the_edits_assume():
    assert [s.kind for s in BASE.steps] == ["pad", "reduce_scatter", "unpad", "exchange"]


def test_all_to_all_moves_are_checked():
    plan = _plan("f32[16{y}, 16, 16{x}]", "f32[16, 16{x,y}, 16]")
    data = json.loads(plan.to_json())
    for moves, message in [([], "moves must be a non-empty list of [src_dim, dst_dim, axes], got []"),
                           ([[2, 1]], "moves must be a non-empty list"),
                           ([[2, 1, ["x"]], [2, 1, ["y"]]], "needs two moves or more, from distinct dims"),
                           ([[2, 2, ["x"]]], "moves axes within one dim"),
                           ([[2, 1, ["x"]], [0, 1, ["y"]], [1, 0, []]], "needs two moves or more"),
                           ([[2, "1", ["x"]]], "moves[0][1] must be an integer")]:
        data["steps"][0]["args"]["moves"] = moves
        with pytest.raises(ShardingError, match="step 0 \\(all_to_all\\)") as e:
            Plan.from_json(json.dumps(data))
        assert message in str(e.value)


@pytest.mark.parametrize("axes", [["x", "x"], ["x", "x:(2)2"]])
def test_a_file_whose_step_names_an_axis_twice_or_overlapping_axes_is_refused(axes):
    """The step's typing rule refuses axes that define no group of devices, so the reader does, at the step."""
    plan = Plan.from_steps(ShardingType.parse("f32[8] partial{x}", MESH), [S.AllReduce(("x",))])
    data = json.loads(plan.to_json())
    data["steps"][0]["args"]["axes"] = axes
    data["steps"][0].pop("step")
    with pytest.raises(ShardingError) as e:
        Plan.from_json(json.dumps(data))
    message = str(e.value)
    assert message.startswith(f"plan file: step 0 (all_reduce): all_reduce({{{','.join(axes)}}}): ") and (
        "named twice" in message or "overlap" in message), message


def test_not_text_is_refused():
    with pytest.raises(ShardingError, match="takes the text of a plan file \\(str or bytes\\), got dict"):
        Plan.from_json(BASE.to_dict())


# ---------------------------------------------------------------------------- random corruption
def _paths(obj, prefix=()):
    """Every path into a JSON value (keys and indices), the value's own path first."""
    yield prefix
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        yield from _paths(v, prefix + (k,))


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 12) | st.sampled_from(["x", "y", "x:(1)2", "q", "", "f32[5, 4]"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["dim", "axes", "kind"]), inner,
                                                                max_size=2),
    max_leaves=6)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_loaded_file_never_disagrees_with_its_plan(data):
    """Replace, delete or duplicate any part of a valid file: the reader either raises ShardingError or
    returns a plan that every field left in the file agrees with, and that ``verify`` proves."""
    plan = data.draw(st.sampled_from(PLANS[:30] + [BASE]))
    doc = json.loads(plan.to_json())
    path = data.draw(st.sampled_from(list(_paths(doc))[1:]))
    *parent_path, key = path
    parent = doc
    for k in parent_path:
        parent = parent[k]
    how = data.draw(st.sampled_from(["replace", "delete", "duplicate"]))
    if how == "replace":
        parent[key] = data.draw(JSON_VALUES)
    elif how == "delete":
        del parent[key]
    elif isinstance(parent, list):
        parent.insert(key, copy.deepcopy(parent[key]))
    else:
        parent[key] = [parent[key], copy.deepcopy(parent[key])]
    try:
        loaded = Plan.from_json(json.dumps(doc))
    except ShardingError:
        return
    derived = loaded.to_dict()
    for k, v in doc.items():
        if k != "steps":
            assert derived[k] == v, k
    for mine, theirs in zip(derived["steps"], doc["steps"], strict=True):
        assert {k: mine[k] for k in theirs} == theirs
    assert verify(loaded).ok
