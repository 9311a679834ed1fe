"""The model zoo (``examples/zoo``: training steps written the way flax.linen, flax.nnx, equinox and plain JAX
with optax write them) under the presets: every preset and composition that applies runs on every model on a
2x4 mesh and equals the unpartitioned step (loss and updated parameters and state), which it returns in the
types they came in; Megatron, ZeRO-3 and the embedding preset shard exactly the weights each model's docstring
lists, inside the scan for the scanned models; a preset that does not apply says so. Variants marked ``slow`` run a part of a composition that a
faster case runs whole (``-m "not slow"`` skips them)."""

import fnmatch

import pytest

import jax
pytest.importorskip("flax")
pytest.importorskip("optax")
eqx = pytest.importorskip("equinox")
import jax.numpy as jnp  # noqa: E402

import redist  # noqa: E402
import partir_core as pc  # noqa: E402
from examples import zoo  # noqa: E402
from partir_core import choice, models, presets, schedules  # noqa: E402
from partir_core.program import ControlFlow, Reshard, walk  # noqa: E402
from tests.partir_core.helpers import assert_same  # noqa: E402


MESH = redist.Mesh({"batch": 2, "model": 4})
slow = pytest.mark.slow
EMBEDDINGS = ("flax_lm", "jax_lm")  # the models with an embedding table
STATELESS = ("gnn",)  # plain SGD: no optimizer state for ZeRO-1/2 to shard
SCANNED = ("flax_lm", "jax_lm")  # layers run by one lax.scan over stacked weights


def applies(name) -> list[str]:
    """The schedules that apply to zoo model ``name``, compositions first."""
    out = ["BP+MP+Z3"] + (["BP+EMB"] if name in EMBEDDINGS else []) + (["Z2"] if name not in STATELESS else [])
    return out + ["BP", "MP", "Z3", "BP+MP"] + (["EMB"] if name in EMBEDDINGS else [])


FAST = ("BP+MP+Z3", "BP+EMB", "Z2")
CASES = [pytest.param(n, s, marks=() if s in FAST else slow) for n in zoo.NAMES for s in applies(n)]
_BUILT: dict = {}


def built(name):
    """``(step, inputs, unpartitioned result, traced step)`` of a zoo model, built once per session."""
    if name not in _BUILT:
        step, inputs = zoo.module(name).make()
        _BUILT[name] = (step, inputs, jax.jit(step)(*inputs), presets.TracedStep(step, inputs))
    return _BUILT[name]


def tactics(name, schedule):
    step, inputs, _, _ = built(name)
    return schedules.schedule(schedule, step, inputs, mesh=MESH)


def dims_of(preset, name) -> dict:
    """The ``{path: dim}`` of the one tactic ``preset`` makes for zoo model ``name``."""
    (tactic,) = preset.tactics(built(name)[3], MESH)
    return tactic.dims


def expand(name, patterns) -> list[str]:
    """The input paths of zoo model ``name`` that one of ``patterns`` matches, arrays of rank 1 or more only."""
    traced = built(name)[3]
    return [p for p, shape in traced.leaves if shape and any(fnmatch.fnmatchcase(p, q) for q in patterns)]


@pytest.mark.parametrize("name,schedule", CASES)
def test_zoo_model_partitioned_equals_unpartitioned(name, schedule):
    step, inputs, want, _ = built(name)
    pf = pc.jit(step, MESH, tactics(name, schedule))
    low = pf.lower(*inputs)
    assert not low.unsupported
    assert not low.fallbacks and not low.carry_reshards
    assert_same(pf(*inputs), want)
    # every step returns (parameters, optimizer state, loss): the first two in the types they came in, so a
    # training loop feeds them back as they are
    is_type = lambda t: isinstance(t, redist.ShardingType)  # noqa: E731
    assert jax.tree.leaves(low.out_types[:2], is_leaf=is_type) == jax.tree.leaves(low.in_types[:2], is_leaf=is_type)
    if name in SCANNED and "MP" in schedule:
        # Megatron inside the scan: the layers' model-axis collectives run in the loop bodies, every iteration
        # (a pending sum reduced there); nothing split on the model axis is gathered around the loops
        loops = [i for i in walk(low.program.instructions) if isinstance(i, ControlFlow)]
        inside = [c for loop in loops for body in loop.bodies for ins in body if isinstance(ins, Reshard)
                  for c in ins.collectives if "model" in c.axes]
        assert any(c.kind in ("all_reduce", "reduce_scatter") for c in inside)
        assert all(c.trips == 2 for c in inside)
        assert not [c for c in low.collectives if "model" in c.axes and c.kind in ("all_gather", "exchange")
                    and c.trips == 1 and c.where.endswith("(scan)")]


@pytest.mark.parametrize("name", ["eqx_mlp", "flax_mlp"])
def test_relu_gradients_are_made_in_the_layout_their_readers_want(name):
    # a ReLU's gradient is select_n(mask, zeros, g): its zeros, a broadcast scalar, are made in any layout for
    # nothing, so they do not hold the gradient in the layout propagation gave them while the weight gradients
    # read it in another (an all-to-all per layer in the backward pass under BP+MP+Z3 otherwise)
    step, inputs, want, _ = built(name)
    pf = pc.jit(step, MESH, tactics(name, "BP+MP+Z3"))
    low = pf.lower(*inputs)
    graph = low.graph
    relu_grads = [i for i, e in enumerate(graph.eqns)
                  if e.name == "select_n" and set(e.invars) & choice.fills(graph)]
    backward = [c for c in low.collectives if int(c.where.split()[1]) > relu_grads[0]]
    assert backward and not [c for c in backward if c.kind == "all_to_all"]
    assert_same(pf(*inputs), want)


@pytest.mark.parametrize("name", EMBEDDINGS)
def test_batch_parallel_embedding_gradient_is_scattered_per_device_and_all_reduced(name):
    # the scatter-add making an embedding's gradient contracts the tokens' gradients with their ids: under
    # data parallelism each device scatters its own tokens and the table's gradient joins the step's other
    # all-reduces, as a matmul's weight gradient does, rather than every device gathering all the tokens'
    # ids and gradients (two collectives of their own, one per dtype) and scattering them all
    step, inputs, want, _ = built(name)
    pf = pc.jit(step, MESH, tactics(name, "BP"))
    low = pf.lower(*inputs)
    assert {c.kind for c in low.collectives} == {"all_reduce"}
    # the table's gradient: the scatter-add into a whole table (the loss's others scatter into batch-split logits)
    (table,) = [e.outvars[0] for e in low.graph.eqns
                if e.name == "scatter-add" and not any(low.types[e.invars[0]].dims)]
    assert low.types[table].partial == ("batch",)
    assert_same(pf(*inputs), want)


def test_megatron_all_reduces_two_activations_each_way_per_block():
    # Megatron's f and g: the forward pass all-reduces the outputs of the block's two row-parallel matmuls
    # (attention out, MLP down), the backward the gradients entering its two layer norms, each once for all the
    # ops that read it; the norms' scale and bias gradients, made from the reduced gradient, need no reduction
    # of their own (a reader keeping the gradient pending would leave them, and two of a norm's statistics, a
    # reduction each)
    step, inputs, want, _ = built("nnx_encoder")
    pf = pc.jit(step, MESH, tactics("nnx_encoder", "MP"))
    low = pf.lower(*inputs)
    x = inputs[2]
    activation = 2 * (4 - 1) / 4 * x.nbytes  # an all-reduce over 4 devices of f32[batch, seq, d_model], as x
    assert [(c.kind, c.axes, c.bytes) for c in low.collectives] == [("all_reduce", ("model",), activation)] * 4
    readers, analysis = low.graph.readers(), low.program.analysis
    for v, t in analysis.types.items():
        if t.partial and len(readers.get(v, ())) > 1:
            read_as = {analysis.ops[i].in_types[k] for i in readers[v]
                       for k, u in enumerate(low.graph.eqns[i].invars) if u == v}
            assert len(read_as) == 1 and not read_as.pop().partial
    assert_same(pf(*inputs), want)


@pytest.mark.parametrize("name", zoo.NAMES)
def test_megatron_shards_what_the_docstring_lists(name):
    want = {p: int(d) for p, d in zoo.listed(name, "Megatron")}
    assert want and dims_of(presets.megatron(), name) == want


@pytest.mark.parametrize("name", zoo.NAMES)
def test_zero3_shards_what_the_docstring_lists_on_the_largest_dims(name):
    """Every parameter and optimizer-state array the docstring lists, nothing else, each on its largest dim that
    the batch axis divides and never on a stacked layer dim."""
    got = dims_of(presets.zero(3), name)
    assert sorted(got) == sorted(expand(name, [p for (p,) in zoo.listed(name, "ZeRO-3")]))
    stacked = expand(name, [p for (p,) in zoo.listed(name, "Stacked layer dims")])
    assert not stacked or name in SCANNED
    shapes = dict(built(name)[3].leaves)
    for p, d in got.items():
        first = 1 if p in stacked else 0
        even = [k for k in range(first, len(shapes[p])) if shapes[p][k] % 2 == 0]
        assert d == max(even, key=lambda k: shapes[p][k]), p


@pytest.mark.parametrize("name", EMBEDDINGS)
def test_embedding_shards_what_the_docstring_lists(name):
    assert dims_of(presets.embedding(), name) == {p: int(d) for p, d in zoo.listed(name, "Sharded embeddings")}


@pytest.mark.parametrize("name", zoo.NAMES)
def test_presets_that_do_not_apply_say_so(name):
    """Embeddings where no parameter is read by a gather of data indices, ZeRO-1/2 where no optimizer state; ZeRO-1
    and ZeRO-2 give the same tactics (see ``presets.zero``)."""
    traced = built(name)[3]
    if name not in EMBEDDINGS:
        with pytest.raises(pc.PartitionError, match=r"embedding found no embedding table \(a parameter read by a "
                                                    r"gather of data indices\) in step"):
            presets.embedding().tactics(traced, MESH)
    if name in STATELESS:
        with pytest.raises(pc.PartitionError, match=r"zero\(2\) found no optimizer state to shard in step"):
            presets.zero(2).tactics(traced, MESH)
    else:
        assert [str(t) for t in presets.zero(1).tactics(traced, MESH)] == \
            [str(t) for t in presets.zero(2).tactics(traced, MESH)]


def test_a_module_with_non_array_leaves_is_a_clear_error():
    """An equinox module passed whole has functions among its leaves: a PartitionError naming the leaf and
    saying to pass the arrays (``eqx.partition``), from ``jit``, from the preset schedules and from the presets
    alike."""
    model = eqx.nn.MLP(4, 2, 8, 1, key=jax.random.key(0))

    def step(params, x):
        return jax.vmap(params)(x)

    x = jnp.ones((4, 4))
    with pytest.raises(pc.PartitionError, match=r"params/activation.*eqx\.partition"):
        pc.jit(step, MESH, [pc.ManualPartition({"x": 0}, axis="batch")])(model, x)
    as_model = models.Model("eqx", step, None, {"x": 0})
    for preset in ("MP", "BP+MP+Z3"):
        with pytest.raises(pc.PartitionError, match=r"params/activation.*eqx\.partition"):
            schedules.schedule(preset, as_model, (model, x), mesh=MESH)
    with pytest.raises(pc.PartitionError, match=r"params/activation.*eqx\.partition"):
        presets.megatron()(step, model, x)

