"""The backends side by side (redist/backends): one interpreter loop, a program and its buffers checked once per
call, every all-to-all in its leading-dim form, and no backend that plans. The MPI counterparts of the checks
run under mpiexec in tests/redist/test_mpi_backend.py."""

from __future__ import annotations

import ast
import collections
import pathlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import redist
from redist import ShardingError, buffers
from redist import program as P
from redist.blocks import Copy
from redist.backends import interpreter, numpy_backend
from tests.redist.strategies import meshes, type_pairs

jax = pytest.importorskip("jax")
from redist.backends import jax_backend  # noqa: E402
from tests import ROOT

if len(jax.devices()) < 8:
    pytest.skip("needs 8 JAX devices (tests/conftest.py sets XLA_FLAGS)", allow_module_level=True)

MESH = redist.Mesh.parse("x=2,y=4")
BACKEND_MODULES = ["redist.backends.interpreter", "redist.backends.numpy_backend", "redist.backends.jax_backend",
                   "redist.backends.mpi_backend"]


# ---------------------------------------------------------------------- the import graph
def _source(module: str) -> pathlib.Path | None:
    path = ROOT.joinpath(*module.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def _imported(module: str) -> set[str]:
    """The redist modules that ``module``'s source imports by name, in any scope (a function's own imports
    included): ``from redist import program`` is ``redist.program``, ``from redist import ShardingError`` the
    package ``redist`` itself."""
    out = set()
    for node in ast.walk(ast.parse(_source(module).read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out |= {f"{node.module}.{a.name}" if _source(f"{node.module}.{a.name}") else node.module
                    for a in node.names}
    return {m for m in out if m == "redist" or m.startswith("redist.")}


def _reachable(module: str) -> set[str]:
    """Every redist module that ``module`` imports, directly or through the modules it imports. A package's
    ``__init__`` counts where it is imported by name, not as the parent of a submodule (``redist/__init__.py``
    imports the whole public API, planning included, whichever submodule is asked for)."""
    seen, todo = set(), [module]
    while todo:
        for m in _imported(todo.pop()) - seen:
            seen.add(m)
            todo.append(m)
    return seen


@pytest.mark.parametrize("module", BACKEND_MODULES)
def test_backends_do_not_import_the_synthesizer(module):
    assert "redist.synthesis" not in _reachable(module), sorted(_reachable(module))


@pytest.mark.parametrize("entry", ["redist.jax", "redist.mpi"])
def test_the_entry_points_plan_and_so_import_the_synthesizer(entry):
    """The check above can see the synthesizer: the public entry points that plan do import it."""
    assert "redist.synthesis" in _reachable(entry)


# ---------------------------------------------------------------------- the canonical all-to-all
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(meshes(max_devices=16).flatmap(lambda mesh: type_pairs(mesh=mesh, max_rank=3)))
def test_every_all_to_all_is_lowered_to_its_leading_dim_form_and_proved(pair):
    src, dst = pair
    plan = redist.synthesize(src, dst)
    program = plan.program
    exchanges = [t for t, ins in enumerate(program.instructions) if isinstance(ins, P.AllToAll)]
    for t in exchanges:
        assert program.shapes[t][0] == program.mesh.group_size(program.instructions[t].axes) > 1, program
    # One AllToAll per all-to-all step that moves data (one move or several).
    moving = [s for s in plan.steps if s.kind == "all_to_all" and src.mesh.group_size(s.axes) > 1]
    assert len(exchanges) == len(moving), program
    assert redist.verify(plan).ok


def test_one_move_all_to_all_is_one_leading_dim_exchange_between_local_views():
    src, dst = (redist.ShardingType.parse(t, MESH) for t in ("f32[8, 16{y}, 4]", "f32[8{y}, 16, 4]"))
    program = redist.synthesize(src, dst).program
    kinds = [type(i).__name__ for i in program.instructions]
    # Dim 0 is split into its 4 chunks, which are already in front; the 4 senders become the major part of dim 1.
    assert kinds == ["Reshape", "AllToAll", "Transpose", "Reshape"], program
    assert program.shapes[1:] == ((4, 2, 4, 4), (4, 2, 4, 4), (2, 4, 4, 4), (2, 16, 4))


# ---------------------------------------------------------------------- checked once, refused in the user's terms
def _counting(monkeypatch):
    calls = collections.Counter()
    for module, name in ((interpreter, "check_program"), (buffers, "local_buffer")):
        original = getattr(module, name)

        def wrapped(*args, _original=original, _name=name, **kwargs):
            calls[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapped)
    return calls


@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_each_backend_checks_the_program_once_and_each_buffer_once(monkeypatch, backend):
    src, dst = (redist.ShardingType.parse(t, MESH) for t in ("f32[8{x}, 16{y}]", "f32[8{y}, 16{x}]"))
    plan = redist.synthesize(src, dst)
    shards = redist.shard(src, np.arange(128, dtype=np.float32).reshape(8, 16))
    calls = _counting(monkeypatch)
    out = redist.execute(plan, shards, backend=backend)
    assert calls == {"check_program": 1, "local_buffer": MESH.size}
    np.testing.assert_array_equal(redist.unshard(dst, out), np.arange(128).reshape(8, 16))


def test_jax_run_program_checks_once_inside_a_shard_map(monkeypatch):
    src, dst = (redist.ShardingType.parse(t, MESH) for t in ("f32[8{x}, 16{y}]", "f32[8, 16{y,x}]"))
    program = redist.synthesize(src, dst).program
    assert not any(":" in a for a in program.axis_tokens())  # no sub-axes: the shard_map runs on the JAX mesh
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("x", "y"))
    spec = src.partition_spec()
    calls = _counting(monkeypatch)
    f = jax.shard_map(lambda b: jax_backend.run_program(program, b), mesh=mesh, in_specs=spec,
                      out_specs=dst.partition_spec(), check_vma=False)
    a = np.arange(128, dtype=np.float32).reshape(8, 16)
    np.testing.assert_array_equal(np.asarray(jax.jit(f)(a)), a)
    assert calls == {"check_program": 1}


class _Narrower(P.Slice):
    """Not an instruction of redist.program: the backends do not know what it means."""


def _ill_formed():
    """(what is wrong, program) for programs that no backend may run."""
    even = redist.synthesize(*(redist.ShardingType.parse(t, MESH) for t in ("f32[8{x}, 16]", "f32[8, 16{x}]")))
    good = even.program
    a2a = next(t for t, i in enumerate(good.instructions) if isinstance(i, P.AllToAll))

    def replaced(t, ins, shapes=good.shapes):
        return P.Program(good.mesh, good.dtype, good.instructions[:t] + (ins,) + good.instructions[t + 1:], shapes)

    return [
        ("not a program", good.instructions),
        ("unknown instruction", P.Program(good.mesh, good.dtype, (_Narrower(0, ("x",)),), ((4, 16), (2, 16)))),
        ("leading dim", replaced(a2a, P.AllToAll(("y",)))),
        ("does not split", P.Program(good.mesh, good.dtype, (P.Slice(1, ("y",)),), ((4, 6), (4, 1)))),
        ("no dim", P.Program(good.mesh, good.dtype, (P.AllGather(2, ("y",)),), ((4, 16), (4, 64)))),
        ("shapes", P.Program(good.mesh, good.dtype, good.instructions, good.shapes[:-1] + ((16, 8),))),
        ("count", P.Program(good.mesh, good.dtype, good.instructions, good.shapes[:1])),
        ("permutation", P.Program(good.mesh, good.dtype, (P.CollectivePermute((0, 0, 1, 2, 3, 4, 5, 6)),),
                                  ((4, 16), (4, 16)))),
        ("overlap", P.Program(good.mesh, good.dtype, (P.Exchange((4, 16), P.CopyTable(((
            Copy(0, (0, 0), (0, 0), (2, 16)), Copy(0, (2, 0), (1, 0), (2, 16))),) + ((),) * 7)),), ((4, 16), (4, 16)))),
    ]


MATCHES = {"not a program": "needs a redist.program.Program", "unknown instruction": "not an instruction of",
           "leading dim": "leading dim must hold the 4 chunks", "does not split": "does not split into 4",
           "no dim": "has no dim 2", "shapes": r"program says \(16, 8\)", "count": "one more than instructions",
           "permutation": "not a permutation of the 8 devices", "overlap": "of device 0 overlap"}


@pytest.mark.parametrize("what", list(MATCHES))
@pytest.mark.parametrize("run", ["numpy", "jax", "jax run_program"])
def test_backends_refuse_an_ill_formed_program_before_running_it(what, run):
    program = dict(_ill_formed())[what]
    shards = [np.zeros((4, 16), np.float32)] * MESH.size
    with pytest.raises(ShardingError, match=MATCHES[what]):
        if run == "numpy":
            numpy_backend.run(program, shards)
        elif run == "jax":
            jax_backend.run_on_buffers(program, shards)
        else:
            jax_backend.run_program(program, jax.numpy.zeros((4, 16), np.float32))


# ---------------------------------------------------------------------- the loop
def test_a_program_of_empty_buffers_moves_nothing():
    src, dst = (redist.ShardingType.parse(t, MESH) for t in ("f32[0{x}, 16{y}]", "f32[0{y}, 16{x}]"))
    program = redist.synthesize(src, dst).program
    assert program.instructions

    class Refusing(numpy_backend.NumpyBackend):
        def all_to_all(self, ins, bufs):
            raise AssertionError("a collective ran on empty buffers")

        collective_permute = all_gather = reduce_scatter = all_reduce = exchange = all_to_all

    out = interpreter.run(program, Refusing(MESH), [np.zeros(src.local_shape, np.float32)] * MESH.size)
    assert [x.shape for x in out] == [dst.local_shape] * MESH.size


def test_a_backend_must_implement_every_instruction():
    class Partial(interpreter.Backend):
        def reshape(self, ins, x):
            return x

    with pytest.raises(TypeError, match="abstract"):
        Partial()
    assert set(interpreter.METHODS) == set(P.Instruction.__args__)
