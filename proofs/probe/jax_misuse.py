"""``redist.jax.reshard`` and ``redist.jax.lower`` misused: bad partition specs (unknown axes, an axis twice,
junk entries, too many entries), shardings on other meshes or device orders, pytrees of shardings that are no
prefix of ``x``, leaves of odd dtypes and kinds (strings, objects, masked arrays, deleted arrays, huge Python
ints), bad ``src`` and ``donate``, under ``jax.set_mesh`` and ``jax.jit`` or not. Each call, written as the
code a user would run after :data:`JAX_SETUP` (its reproducer), raises a :class:`redist.ShardingError` of at
most two lines, or returns ``x``'s values."""

from __future__ import annotations

import math
import random
from typing import Callable

from proofs.probe.tally import Tally, unexpected
from redist.errors import ShardingError

JAX_SETUP = """\
import jax, jax.numpy as jnp, numpy as np, redist.jax
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = jax.make_mesh((2, 4), ('x', 'y'))
reversed_mesh = jax.sharding.Mesh(np.array(jax.devices()[::-1]).reshape(2, 4), ('x', 'y'))
small_mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]), ('x',))
"""
SHAPES = ((8,), (8, 4), (4, 8), (6,), (5, 3), (), (0, 4), (16, 2, 2), (2, 2, 2, 2, 2))
JAX_DTYPES = ("float32", "int32", "bool_", "complex64", "float16", "uint8", "int8", "float64", "int64", "uint32")
ODD_LEAVES = ("'abc'", "None", "object()", "np.array(['a', 'b'])", "np.array([1, 'a'], dtype=object)",
              "np.ma.masked_array(np.arange(8.0), mask=np.arange(8) % 2 == 0)", "np.arange(8).astype('datetime64[s]')",
              "b'bytes'", "{1, 2}", "slice(1)", "jax.ShapeDtypeStruct((8,), jnp.float32)", "2**70", "1 + 2j",
              "np.float32(1.5)", "True", "3", "jnp.arange(8).astype(jnp.bfloat16)", "np.zeros((2**16, 0))")
BAD_ENTRIES = ("'z'", "('x', 'x')", "3", "'xy'", "P.UNCONSTRAINED", "{'x'}", "['x']", "''", "('x', None)")
JUNK_SHARDINGS = ("'x'", "3", "mesh", "P", "NamedSharding", "jax.sharding.SingleDeviceSharding(jax.devices()[0])",
                  "np.zeros(3)", "[]", "{}", "()", "object()", "P('x').__class__", "NamedSharding(mesh, P())._spec")


def _spec(rng: random.Random, rank: int, bad: float, axes=("x", "y")) -> str:
    """A ``P(...)`` of about ``rank`` entries (one more or fewer now and then): each an entry of
    :data:`BAD_ENTRIES` with probability ``bad``, else ``None`` or ``axes`` not used yet."""
    entries, free = [], list(axes)
    for _ in range(max(0, rank + rng.choice((0, 0, 0, -1, 1)))):
        if rng.random() < bad:
            entries.append(rng.choice(BAD_ENTRIES))
            continue
        take = rng.sample(free, rng.randint(0, len(free)))
        free = [a for a in free if a not in take]
        entries.append("None" if not take else repr(take[0]) if len(take) == 1 else repr(tuple(take)))
    return f"P({', '.join(entries)})"


def _sharding(rng: random.Random, rank: int) -> str:
    r = rng.random()
    if r < 0.5:
        mesh = rng.choice(("mesh", "mesh", "mesh", "reversed_mesh", "small_mesh"))
        return f"NamedSharding({mesh}, {_spec(rng, rank, 0.05, ('x',) if mesh == 'small_mesh' else ('x', 'y'))})"
    if r < 0.85:
        return _spec(rng, rank, 0.25)
    return rng.choice(("None",) + JUNK_SHARDINGS)


def _leaf(rng: random.Random) -> tuple[str, int]:
    """A leaf's code and its rank."""
    shape = rng.choice(SHAPES)
    dtype = rng.choice(JAX_DTYPES)
    host = f"np.arange({math.prod(shape)}).reshape({shape}).astype(np.{dtype})"
    kind = rng.choice(("host", "mesh", "mesh", "mesh", "single device", "odd", "deleted"))
    if kind == "host":
        return host, len(shape)
    if kind == "single device":
        return f"jnp.asarray({host})", len(shape)
    if kind == "odd":
        return rng.choice(ODD_LEAVES), 1
    spec = []
    sizes = {"x": 2, "y": 4}
    free = ["x", "y"]
    for n in shape:
        fits = [a for a in free if n % sizes[a] == 0 and rng.random() < 0.5]
        spec.append(repr(fits[0]) if fits else "None")
        free = [a for a in free if a not in fits[:1]]
    placed = f"jax.device_put({host}, NamedSharding(mesh, P({', '.join(spec)})))"
    return (f"(lambda a: (a.delete(), a)[1])({placed})" if kind == "deleted" else placed), len(shape)


def _tree(rng: random.Random, depth: int = 0):
    """A pytree's code and its shape: ``("leaf", rank)``, or a list, tuple or dict of such shapes."""
    if depth >= 2 or rng.random() < 0.6:
        code, rank = _leaf(rng)
        return code, ("leaf", rank)
    kind = rng.choice(("list", "tuple", "dict"))
    children = [_tree(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    codes = [c for c, _ in children]
    if kind == "dict":
        keys = [f"k{i}" for i in range(len(children))]
        return "{" + ", ".join(f"{k!r}: {c}" for k, c in zip(keys, codes)) + "}", ("dict", dict(
            zip(keys, (s for _, s in children))))
    code = "[" + ", ".join(codes) + "]" if kind == "list" else "(" + "".join(c + ", " for c in codes) + ")"
    return code, (kind, [s for _, s in children])


def _shardings(rng: random.Random, shape, depth: int = 0) -> str:
    """A sharding for a tree of ``shape``: one for every leaf, or a prefix of the tree, now and then off it (a
    key dropped or added, an entry too many or too few, a list for a tuple)."""
    kind, inner = shape
    if kind == "leaf" or rng.random() < 0.4:
        return _sharding(rng, inner if kind == "leaf" else 1)
    if kind == "dict":
        items = [(k, _shardings(rng, s, depth + 1)) for k, s in inner.items()]
        if items and rng.random() < 0.2:
            items.pop(rng.randrange(len(items)))
        if rng.random() < 0.15:
            items.append(("extra", "None"))
        return "{" + ", ".join(f"{k!r}: {v}" for k, v in items) + "}"
    items = [_shardings(rng, s, depth + 1) for s in inner]
    if rng.random() < 0.2:
        items = items[:-1] if items and rng.random() < 0.5 else items + ["None"]
    if rng.random() < 0.15:
        kind = "list" if kind == "tuple" else "tuple"
    return "[" + ", ".join(items) + "]" if kind == "list" else "(" + "".join(i + ", " for i in items) + ")"


def misuse_code(rng: random.Random) -> tuple[str, str, bool]:
    """A call of ``redist.jax.reshard`` (or ``lower``), as code to run after :data:`JAX_SETUP`: what sets its
    arguments (``x``, ``sharding``, ``src``: what a user builds, with JAX, before calling redist), the call (it
    sets ``out``), and whether ``out`` should hold ``x``'s values. Under ``jax.jit`` the leaves are arrays (JAX
    itself refuses to trace others)."""
    how = rng.choice(("eager", "eager", "jit", "lower"))
    while True:
        x, shape = _tree(rng)
        if how != "jit" or not any(odd in x for odd in ODD_LEAVES + ("delete",)):
            break
    arguments = [f"x = {x}", f"sharding = {_shardings(rng, shape)}",
                 f"src = {_shardings(rng, shape) if rng.random() < 0.15 else None}"]
    donate = rng.choice(("True", "True", "False", repr("yes"), "1", "None")) if rng.random() < 0.15 else "False"
    if how == "eager":
        call, values = f"out = redist.jax.reshard(x, sharding, src=src, donate={donate})", True
    elif how == "jit":
        call, values = f"out = jax.jit(lambda x: redist.jax.reshard(x, sharding, src=src, donate={donate}))(x)", True
    else:
        call, values = f"out = redist.jax.lower(x, sharding, src=src, donate={donate})", False
    if rng.random() < 0.6:
        call = "with jax.set_mesh(mesh):\n    " + call
    return "\n".join(arguments), call, values


def case(tally: Tally, rng: random.Random, quick: bool, announce: Callable[[str], None]) -> None:
    """One misuse: a ShardingError of at most two lines, or ``x``'s values in ``out``. Arguments that JAX itself
    cannot build (a ``NamedSharding`` of a spec that does not fit its mesh, say) make no input of redist's."""
    import jax
    import numpy as np

    arguments, call, values = misuse_code(rng)
    where = f"after proofs/probe/jax_misuse.py JAX_SETUP:\n{arguments}\n{call}\n"
    announce(where)
    scope: dict = {}
    exec(JAX_SETUP, scope)  # noqa: S102 - the probe's own code
    try:
        exec(arguments, scope)  # noqa: S102
    except Exception:  # noqa: BLE001 - JAX or numpy refuses to build the arguments: not redist's
        tally.add("setup refused by JAX")
        return
    try:
        want = [np.array(leaf) for leaf in jax.tree.leaves(scope["x"])]
    except Exception:  # noqa: BLE001 - a deleted array: no values to compare
        want = None
    try:
        exec(call, scope)  # noqa: S102
    except ShardingError as e:
        lines = len(str(e).splitlines())
        tally.add("refused" if lines <= 2 else "long message", None if lines <= 2 else
                  f"{where}raised a ShardingError of {lines} lines: {str(e)[:600]}")
        return
    except Exception as e:  # noqa: BLE001 - what the probe looks for
        tally.add("other error", f"{where}{unexpected(e)}")
        return
    if not values:
        tally.add("lowered")
        return
    got = [np.asarray(leaf) for leaf in jax.tree.leaves(scope["out"])]
    same = want is None or len(got) == len(want) and all(
        g.shape == w.shape and np.array_equal(g, w.astype(g.dtype)) for g, w in zip(got, want))
    tally.add("moved" if same else "wrong", None if same else f"{where}out does not hold x's values")
