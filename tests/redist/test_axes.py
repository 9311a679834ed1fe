"""Axes as values (redist.axes): parsed once at the mesh, strings to everyone else, and the axis-list algebra."""

import copy
import dataclasses
import json
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import redist
from redist import Mesh, ShardingError, ShardingType, cost
from redist import program as P
from redist.backends import numpy_backend
from redist.axes import Axis, axis_name, canonical_axes, check_factorization, remove_axes, split_common, strip_suffix
from redist.steps import AllGather, AllReduce
from tests.redist.strategies import meshes, type_pairs

MESH = Mesh({"x": 2, "y": 4, "z": 6})


def test_an_axis_is_its_token_string():
    """Equality, hashing, printing, JSON and str() are the token's; the parsed fields ride along."""
    a = MESH.axis("y:(2)2")
    assert isinstance(a, Axis) and isinstance(a, str)
    assert (a.name, a.pre, a.size, a.axis_size, a.stop, a.stride) == ("y", 2, 2, 4, 4, 1)
    assert a == "y:(2)2" and "y:(2)2" == a and hash(a) == hash("y:(2)2")
    assert repr(a) == "'y:(2)2'" and f"{a}" == "y:(2)2" and json.dumps([a]) == '["y:(2)2"]'
    assert type(str(a)) is str and str(a) == "y:(2)2"
    assert {a: 1}["y:(2)2"] == 1 and {"y:(2)2": 1}[a] == 1
    whole = MESH.axis("z")
    assert whole.is_whole and (whole.pre, whole.size, whole.axis_size) == (1, 6, 6)
    # y = y:(1)2 (major) × y:(2)2 (minor); a coordinate is (c // stride) % size
    assert [a.coord(c) for c in range(4)] == [0, 1, 0, 1]
    assert [MESH.axis("y:(1)2").coord(c) for c in range(4)] == [0, 0, 1, 1]
    assert [MESH.axis("z:(2)3").coord(c) for c in range(6)] == [0, 1, 2, 0, 1, 2]


def test_text_is_canonical():
    """The text is built from the fields: a sub-axis that is the whole axis is written as the axis."""
    assert MESH.axis("y:(1)4") == "y" and MESH.axis("y:(1)4").is_whole
    assert MESH.axis("y:(001)2") == "y:(1)2"
    assert Axis("y", 1, 4, 4) == "y" and Axis("y", 2, 2, 4) == "y:(2)2"


@pytest.mark.parametrize("args, match", [
    (("1y", 1, 2, 4), "not an identifier"),
    ((5, 1, 2, 4), "not an identifier"),
    (("y", 1.0, 2, 4), "must be an integer"),
    (("y", True, 2, 4), "must be an integer"),
    (("y", 1, 3, 4), "does not fit mesh axis 'y' of size 4"),
    (("y", 0, 2, 4), "does not fit"),
    (("y", 2, 1, 4), "does not fit"),
    (("y", 1, 2, 0), "does not fit"),
])
def test_no_invalid_axis_can_be_made(args, match):
    with pytest.raises(ShardingError, match=match):
        Axis(*args)


def test_axes_are_immutable_and_pickle_as_themselves():
    a = MESH.axis("z:(2)3")
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.size = 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        del a.pre
    for b in (pickle.loads(pickle.dumps(a)), copy.copy(a), copy.deepcopy(a)):
        assert type(b) is Axis and b == a and (b.name, b.pre, b.size, b.axis_size) == ("z", 2, 3, 6)


def test_mesh_axis_reads_text_once_and_takes_its_own_axes_as_they_are():
    a = MESH.axis("y:(2)2")
    assert MESH.axis(a) is a
    assert MESH.axes_of(["x", a]) == ("x", "y:(2)2")
    # An axis of another mesh is read again: it must fit this one.
    other = Mesh({"y": 8}).axis("y:(4)2")
    with pytest.raises(ShardingError, match="does not fit mesh axis 'y' of size 4"):
        MESH.axis(other)
    assert MESH.axis(Mesh({"y": 4}).axis("y:(1)2")) == "y:(1)2"


def test_group_size_is_the_product_of_the_sizes_asked_again_or_not():
    """A mesh remembers its group sizes by tuple of names: the answer is the product of the axes' sizes however
    often it is asked, for a list too; an unknown axis raises every time; equality and hashing ignore it."""
    mesh = Mesh({"x": 2, "y": 4})
    for names in [(), ("x",), ("y", "x"), ("y:(2)2",), ("x", "y:(1)2"), ("y:(1)2", "y:(2)2")]:
        want = int(np.prod([mesh.axis(a).size for a in names]))
        assert mesh.group_size(names) == mesh.group_size(names) == mesh.group_size(list(names)) == want
    for _ in range(2):
        with pytest.raises(ShardingError, match="unknown mesh axis 'q'"):
            mesh.group_size(("x", "q"))
    fresh = Mesh({"x": 2, "y": 4})
    assert mesh == fresh and hash(mesh) == hash(fresh) and pickle.loads(pickle.dumps(mesh)) == fresh


@pytest.mark.parametrize("token, match", [
    ("q", "unknown mesh axis 'q'"),
    ("y:(3)2", "does not fit mesh axis 'y'"),
    ("x:(1)1", "does not fit mesh axis 'x'"),
    ("y:2", "cannot read axis"),
    (3, "cannot read axis"),
])
def test_mesh_axis_errors(token, match):
    with pytest.raises(ShardingError, match=match):
        MESH.axis(token)


def test_types_hold_axes_that_compare_equal_to_token_strings():
    """docs/spec.md §2: dims and partial compare equal to tuples of token strings and hash like them; strings are taken
    wherever axes are (constructor, replace, from_partition_spec, steps)."""
    t = ShardingType.parse("f32[8{x}, 24{y:(1)2, z}] partial{y:(2)2}", MESH)
    assert t.dims == (("x",), ("y:(1)2", "z")) and t.partial == ("y:(2)2",)
    assert hash(t.dims) == hash((("x",), ("y:(1)2", "z")))
    assert all(type(a) is Axis for d in t.dims for a in d) and type(t.partial[0]) is Axis
    assert t.dims[1][0].pre == 1 and t.dims[1][0].size == 2
    assert t == ShardingType(MESH, (8, 24), "f32", (("x",), ("y:(1)2", "z")), ("y:(2)2",))
    assert t.replace(dims=((), ("x", "z"))).dims == ((), ("x", "z"))
    u = ShardingType.from_partition_spec((8, 24), "f32", ("x", ("y", "z")), MESH)
    assert u.dims == (("x",), ("y", "z")) and type(u.partition_spec()[1][0]) is str
    assert AllGather(1, ("z",)).apply(u) == u.replace(dims=(("x",), ("y",)))


def test_program_instructions_name_axes_of_the_mesh():
    """Lowering makes every instruction's axes axes of the plan's mesh; their text is the token's, so the
    program prints as before (and the verifier reads that text)."""
    src = ShardingType.parse("f32[4{x}]", Mesh({"x": 2, "y": 4}))
    plan = redist.synthesize(src, ShardingType.parse("f32[4{y}]", src.mesh))
    axes = [a for ins in plan.program.instructions for a in getattr(ins, "axes", ())]
    assert axes and all(type(a) is Axis for a in axes)
    assert "Slice(dim=0, axes=('y:(2)2',))" in str(plan.program)
    assert redist.verify(plan).ok


def test_instructions_over_overlapping_axes_raise():
    """Overlapping axes define no groups: a ShardingError (it was a KeyError from Mesh.groups)."""
    mesh = Mesh({"y": 4})
    with pytest.raises(ShardingError, match="overlap"):
        mesh.groups(("y", "y:(1)2"))
    prog = P.Program(mesh, np.dtype(np.float32), (P.AllGather(0, ("y", "y:(1)2")),), ((2,), (16,)))
    with pytest.raises(ShardingError, match="overlap"):
        numpy_backend.run(prog, [np.zeros(2, np.float32)] * 4)


def test_axis_name_reads_axes_and_token_text():
    assert axis_name(MESH.axis("y:(2)2")) == "y" and axis_name("y:(2)2") == "y" and axis_name("x") == "x"
    assert cost.topology("2x8-nodes", MESH).link("z:(2)3") == cost.NVLINK
    assert cost.topology("2x8-nodes", MESH).link(MESH.axis("x:(1)2")) == cost.INFINIBAND_200G


# ---------------------------------------------------------------------- the algebra
def _ax(*tokens, mesh=MESH):
    return mesh.axes_of(tokens)


def test_canonical_axes_merges_adjacent_pieces():
    assert canonical_axes(_ax("y:(1)2", "y:(2)2")) == ("y",)
    assert canonical_axes(_ax("z:(1)2", "x", "z:(2)3")) == ("z:(1)2", "x", "z:(2)3")
    assert canonical_axes(_ax("z:(2)3", "z:(1)2")) == ("z:(2)3", "z:(1)2")  # minor before major: no merge
    assert all(type(a) is Axis for a in canonical_axes(_ax("y:(1)2", "y:(2)2")))


def test_split_common_cuts_at_every_boundary():
    whole, part = split_common([_ax("x", "z"), _ax("z:(2)3")])
    assert whole == [("x", 1, 2), ("z", 1, 2), ("z", 2, 6)] and part == [("z", 2, 6)]


def test_strip_suffix_and_remove_axes():
    assert strip_suffix(_ax("x", "z"), _ax("z:(2)3")) == ("x", "z:(1)2")
    assert strip_suffix(_ax("x", "z"), _ax("z:(1)2")) is None  # not the minor end
    assert strip_suffix(_ax("x", "z"), ()) is None
    assert remove_axes(_ax("x", "y"), _ax("y:(1)2")) == ("x", "y:(2)2")
    assert remove_axes(_ax("x"), _ax("y")) is None
    assert remove_axes(_ax("x", "y"), ()) == ("x", "y")


def test_pieces_that_are_no_sub_axis_are_not_removed():
    """z:(1)2 is no part of z:(1)3 (2 does not divide 3): remove_axes says so (before, it built the token
    'z:(2)1' and the step failed on it), and the step names the axes it cannot reduce."""
    assert remove_axes(_ax("z:(1)3"), _ax("z:(1)2")) is None
    assert strip_suffix(_ax("z:(1)3"), _ax("z:(1)2")) is None
    t = ShardingType.parse("f32[4] partial{z:(1)3}", MESH)
    with pytest.raises(ShardingError, match=r"\{z:\(1\)2\} are not all partial axes"):
        AllReduce(("z:(1)2",)).apply(t)


def test_check_factorization():
    check_factorization("z", _ax("z:(1)2", "z:(2)3"))
    with pytest.raises(ShardingError, match="incompatible ways"):
        check_factorization("z", _ax("z:(1)2", "z:(3)2"))


@given(st.data())
@settings(max_examples=150, deadline=None)
def test_algebra_agrees_with_factor_sets(data):
    """On random types' axis lists: removing a suffix or a subset gives what is left of the factor positions
    (name, p) the axes cover, and a list's canonical form covers the same positions in the same order."""
    mesh = data.draw(meshes(max_axes=3, max_devices=16))
    src, _ = data.draw(type_pairs(mesh=mesh, max_rank=2))
    axes = tuple(a for d in src.dims for a in d) + src.partial
    cut = data.draw(st.integers(0, len(axes)))
    head, tail = axes[:cut], axes[cut:]

    def positions(xs):
        return [(a.name, p) for a in xs for p in _units(a)]

    assert positions(canonical_axes(axes)) == positions(axes)
    if tail:
        assert positions(strip_suffix(axes, tail)) == positions(head)
    assert positions(remove_axes(axes, tail)) == positions(head)
    assert positions(remove_axes(axes, head)) == positions(tail)


def _units(a: Axis) -> list[int]:
    """The factor positions of its mesh axis that ``a`` covers: ``pre`` to ``stop`` in unit steps of the
    factorization (positions are the cumulative products; an axis of size 1 covers position 1)."""
    return [a.pre] if a.pre == a.stop else list(range(a.pre, a.stop))


def test_groups_over_sub_axes_of_two_decompositions_are_refused():
    """``x:(1)2`` and ``x:(3)2`` of an axis of 6 do not overlap, but are no factors of one decomposition: they
    define no groups (a KeyError from inside ``Mesh.groups`` before)."""
    with pytest.raises(ShardingError, match="incompatible ways"):
        Mesh.parse("x=6").groups(("x:(1)2", "x:(3)2"))
