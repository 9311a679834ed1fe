"""The search's try-steps agree with the typing rules and byte accounting of :mod:`redist.steps`.

From the start state of a search, every move each try-step generates, and every run of two moves that the
search merges into one step, is turned into its typed step by its record; applying that step to the source
must give the type of the search's next state (its atoms, partial atoms and local bytes), and the bytes the
search charges must be the step's own ``bytes_received``. Moves keep the memory-efficient normal form."""

from hypothesis import example, given, settings
from hypothesis import strategies as st

from redist import Mesh, ShardingType
from redist.synthesis.cases import without_unit_axes
from redist.synthesis.moves import TRY_STEPS, UNTRY_STEPS, AllReduceMove, GatherMove, ReduceScatterMove, SliceMove
from redist.synthesis.space import Run, Space, mask
from tests.redist.strategies import meshes, type_pairs


def _successors(space, node):
    """Every move out of ``node``: (record, next state, its local bytes, bytes × scale, new step?)."""
    for try_step in TRY_STEPS:
        for kind, fields, state, local_bytes, received, _, new_step in try_step(space, node):
            yield kind(*fields), state, local_bytes, received, new_step


def _check_run(space, src, dst, start, move, state, local_bytes, charged):
    """The step the run from ``start`` to ``state`` makes (``move`` its last move) types ``src`` as ``state``
    and receives what the search charged for the run."""
    step = move.step(Run(src, start[0], state[0], dst, space.atoms))
    t = step.apply(src)
    assert tuple(space.atoms.expand(d) for d in t.dims) == state[0], (move, step)
    assert mask(space.atoms.expand(t.partial)) == state[1], (move, step)
    assert t.local_bytes == local_bytes, (move, step)
    assert charged == step.bytes_received(src) * space.scale, (move, step)


def _joins(move, move2) -> bool:
    """The module header's runs: slices, reduce-scatters or gathers on one dim."""
    return type(move2) is type(move) and hasattr(move, "dim") and move2.dim == move.dim


# Meshes of three or four axes: dims hold several axes, so runs of moves on one dim occur.
_pairs_on_several_axes = meshes().filter(lambda m: len(m.names) >= 3).flatmap(
    lambda mesh: type_pairs(mesh=mesh, max_rank=3))


def _pair(mesh, a, b):
    return ShardingType.parse(a, mesh), ShardingType.parse(b, mesh)


_M = Mesh({"x": 2, "y": 4, "z": 2})


@given(_pairs_on_several_axes, st.booleans())
@example(_pair(_M, "f32[16{x,y}, 16{z}]", "f32[16, 16]"), False)  # gathers of two axes, from two dims
@example(_pair(_M, "f32[16, 16]", "f32[16{x,y}, 16{z}]"), True)  # runs of slices
@example(_pair(_M, "f32[16, 16] partial{x,y,z}", "f32[16{z,x}, 16{y}]"), True)  # runs of reduce-scatters
@example(_pair(_M, "f32[16{x,z}, 16{y}]", "f32[16{z,x}, 16]"), False)  # an all-to-all of two moves
@settings(max_examples=80, deadline=None)
def test_each_move_and_each_merged_run_makes_the_step_the_search_accounts_for(pair, refine):
    src, dst = (without_unit_axes(t, pair[1].partial) for t in pair)
    space = Space.of(src, dst, refine)
    start = space.start
    start_node = space.node(start, space.local_bytes(start[0]))
    for move, state, local_bytes, received, new_step in _successors(space, start_node):
        assert new_step
        _check_run(space, src, dst, start, move, state, local_bytes, received)
        node = space.node(state, local_bytes)
        if isinstance(move, GatherMove):  # normal form: nothing shrinks the buffer after it has grown
            assert not any(isinstance(m, (SliceMove, ReduceScatterMove)) for m, *_ in _successors(space, node))
        for move2, state2, local_bytes2, received2, new_step2 in _successors(space, node):
            assert new_step2 == (not _joins(move, move2)), (move, move2)
            if not new_step2:
                _check_run(space, src, dst, start, move2, state2, local_bytes2, received + received2)


@given(type_pairs(max_rank=3))
@settings(max_examples=60, deadline=None)
def test_moves_place_only_what_the_destination_wants(pair):
    """Slices push atoms the destination places in dims; gathers pop only atoms it does not; reduce-scatters
    and all-reduces reduce only partial atoms it does not keep."""
    src, dst = pair
    space = Space.of(src, dst, refine=False)
    start = space.start
    node = space.node(start, space.local_bytes(start[0]))
    for move, state, *_ in _successors(space, node):
        if isinstance(move, SliceMove):
            assert space.wanted >> move.atom & 1 and node.free >> move.atom & 1
        elif isinstance(move, GatherMove):
            popped = start[0][move.dim][len(start[0][move.dim]) - move.count:]
            assert not mask(popped) & space.wanted
        elif isinstance(move, ReduceScatterMove):
            assert space.reducible >> move.atom & 1
        elif isinstance(move, AllReduceMove):
            assert state[1] == start[1] & ~space.reducible



def _type_of(space, t, dims, partial):
    """``t`` with the search's ``dims`` and ``partial`` atoms."""
    atoms = space.atoms
    return t.replace(dims=tuple(atoms.compress(d) for d in dims),
                     partial=atoms.compress(a for a in range(len(space.sizes)) if partial >> a & 1))


@given(_pairs_on_several_axes, st.booleans())
@example(_pair(_M, "f32[16{x,y}, 16{z}]", "f32[16, 16]"), False)  # gathers, read backwards
@example(_pair(_M, "f32[16, 16] partial{x,y,z}", "f32[16{z,x}, 16{y}]"), True)  # reduce-scatters
@example(_pair(_M, "f32[16{x,z}, 16{y}]", "f32[16{z}, 16{x,y}]"), False)  # all-to-alls
@settings(max_examples=80, deadline=None)
def test_each_untry_step_is_a_forward_move_the_search_accounts_for(pair, refine):
    """The backward search's moves, from the goal and from each state before it: the record's step, applied
    to the type of the state before, gives the type of the state after, receives what the backward search
    charges, and keeps the normal form (a suffix that slices or reduce-scatters has no gather before it)."""
    src, dst = (without_unit_axes(t, pair[1].partial) for t in pair)
    space = Space.of(src, dst, refine)
    classes = space.sizes  # the symmetry classes of a search without a topology
    goal = (*space.goal, False, None)
    frontier = [goal]
    for depth in range(2):
        nxt = []
        for state in frontier:
            after = _type_of(space, src, state[0], state[1])
            for untry in UNTRY_STEPS:
                for move, before, received, _, tag in untry(space, space.back(state), classes):
                    t = _type_of(space, src, before[0], before[1])
                    step = move.step(Run(t, before[0], state[0], dst, space.atoms))
                    assert step.apply(t) == after, (move, step)
                    assert received == step.bytes_received(t) * space.scale, (move, step)
                    if isinstance(move, GatherMove):
                        assert not before[2], (move, step)
                    nxt.append(before)
        frontier = nxt[:20]
