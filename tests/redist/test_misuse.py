"""Misuse of the public API raises ``ShardingError`` (``PartitionError`` for partir_core's tactics) in the user's
terms, never a TypeError, AttributeError, IndexError or a bare ValueError from inside.

Each case names what was given and what is expected; the match strings below are those words. Keyword calls of
a partitioned function are supported (``pf`` has ``fn``'s signature)."""

import math
import subprocess
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import partir_core as pc  # noqa: E402
import redist  # noqa: E402
from partir_core import schedules  # noqa: E402
from redist import Mesh, ShardingError, ShardingType  # noqa: E402
from redist import cost  # noqa: E402
from redist.mesh import MAX_DEVICES  # noqa: E402
from redist.types import MAX_ELEMENTS  # noqa: E402
from tests.partir_core.helpers import model_and_inputs  # noqa: E402

MESH = Mesh({"x": 2, "y": 4})
T = ShardingType.parse("f32[8{x}]", MESH)
U = ShardingType.parse("f32[8{y}]", MESH)


def _raises(build, match, error=ShardingError):
    with pytest.raises(error, match=match) as info:
        build()
    assert type(info.value).__name__ in ("ShardingError", "PartitionError")
    return info.value


# ------------------------------------------------------------------------------------------------ meshes
@pytest.mark.parametrize("build, match", [
    (lambda: Mesh(None), r"Mesh takes a dict like .*, got NoneType None"),
    (lambda: Mesh(42), r"Mesh takes a dict like .*, got int 42"),
    (lambda: Mesh("x=2"), r"got the string 'x=2' \(Mesh.parse reads text\)"),
    (lambda: Mesh([1, 2]), r"1 is not a \(name, size\) pair"),
    (lambda: Mesh([("x", 2, 3)]), r"\('x', 2, 3\) is not a \(name, size\) pair"),
    (lambda: Mesh({"x": 2.0}), r"mesh axis 'x' has size 2.0; sizes are integers >= 1"),
    (lambda: Mesh({"x": "2"}), r"mesh axis 'x' has size '2'"),
    (lambda: Mesh({"x": True}), r"mesh axis 'x' has size True"),
    (lambda: Mesh({"x": 10**30}), rf"more than {MAX_DEVICES} devices"),
    (lambda: Mesh({"x": 2**16, "y": 2**16}), rf"x=65536, y=65536 has more than {MAX_DEVICES} devices"),
    (lambda: Mesh({"x": 10**5000}), r"x=\(an integer of 16610 bits\) has more than"),
    (lambda: Mesh.parse("x=²"), r"cannot read mesh axis 'x=²' in 'x=²'; expected NAME=SIZE with SIZE in digits 0-9"),
    (lambda: Mesh.parse("x=٢"), r"SIZE in digits 0-9"),  # an Arabic-Indic two: \d and int() accept it
    (lambda: Mesh.parse("x=2,y=३"), r"cannot read mesh axis 'y=३'"),  # a Devanagari three
    (lambda: Mesh.parse(None), r"mesh text must be a string like 'x=2,y=4', got NoneType None"),
    (lambda: Mesh.parse(b"x=2"), r"mesh text must be a string"),
    (lambda: Mesh.parse("x=" + "1" * 5000), r"mesh axis 'x' 111111111111…111111 \(5000 digits\) is too large"),
    (lambda: Mesh.parse("x=4294967296"), rf"the size of mesh axis 'x' 4294967296 is too large; the limit is {MAX_DEVICES}"),
    (lambda: Mesh.parse("x=2=3"), r"cannot read mesh axis 'x=2=3'"),
])
def test_bad_meshes(build, match):
    _raises(build, match)


@pytest.mark.parametrize("text, match", [
    ("x=2device_ids=[1,0]", r"device ids come last, after a comma"),
    ("x=2,device_ids=[1,0", r"device ids come last, after a comma"),
    ("x=2,device_ids=[1,0]]", r"cannot read device id '0\]'"),
    ("device_ids=[0]", r"empty mesh text"),
])
def test_device_ids_come_last_after_a_comma(text, match):
    _raises(lambda: Mesh.parse(text), match)


def test_mesh_text_is_read_in_linear_time():
    """Texts that a backtracking pattern or a scan per id reads in quadratic time (at these lengths, minutes to
    hours) are read in one pass, in milliseconds each. They are parsed in a child process, which the 120 s
    bound kills if it hangs (a regular expression holds the interpreter's lock, so a thread could not)."""
    script = """if True:
        import redist
        n = 200_000
        for text in ["device_ids=[" * n, f"x={n},device_ids=[" + ",".join(map(str, [*range(n - 1), n - 2])) + "]",
                     "x=2," * n]:
            try:
                redist.Mesh.parse(text)
            except redist.ShardingError as e:
                print(e)
    """
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    refusals = out.stdout.splitlines()
    assert len(refusals) == 3, out
    assert "device ids come last" in refusals[0]
    assert "device 199998 is listed twice" in refusals[1]
    assert "cannot read mesh axis ''" in refusals[2]


@pytest.mark.parametrize("coords, match", [
    ({"x": 2, "y": 0}, r"coordinate 2 on mesh axis 'x' is outside the axis \(0 to 1\)"),
    ({"x": 0, "y": -1}, r"coordinate -1 on mesh axis 'y'"),
    ({"x": 0, "y": 1.0}, r"coordinate 1.0 on mesh axis 'y'"),
    ({"x": 0}, r"must give one coordinate for each axis of mesh x=2,y=4 \(x, y\)"),
    ({"x": 0, "y": 0, "z": 0}, r"must give one coordinate for each axis"),
    ([0, 0], r"must give one coordinate for each axis"),
])
def test_device_at_coordinates_outside_the_mesh(coords, match):
    _raises(lambda: MESH.device(coords), match)


def test_mesh_numbers_are_ascii_digits_and_numpy_ints_are_sizes():
    assert Mesh.parse("x=002, y=4") == Mesh({"x": 2, "y": 4})
    assert Mesh({"x": np.int64(2)}) == Mesh({"x": 2}) and Mesh([("x", 2)]).shape == (2,)
    assert Mesh({"x": 2**15, "y": 2**15}).size == 2**30  # large meshes are legal up to MAX_DEVICES


# ------------------------------------------------------------------------------------------------ types
@pytest.mark.parametrize("build, match", [
    (lambda: ShardingType.parse("f32[٨{x}]", MESH), r"cannot read dim 0 '٨\{x\}' .* SIZE in digits 0-9"),
    (lambda: ShardingType.parse("f32[8, ²]", MESH), r"cannot read dim 1 '²'"),
    (lambda: ShardingType.parse("f32[8{y:(٢)2}]", MESH), r"cannot read axis 'y:\(٢\)2'.*digits 0-9"),
    (lambda: ShardingType.parse("f32[8{y:(" + "1" * 5000 + ")2}]", MESH), r"\(5000 digits\) is too large"),
    (lambda: ShardingType.parse("f32[" + "1" * 5000 + "]", MESH), r"the size of dim 0 .*\(5000 digits\) is too large"),
    (lambda: ShardingType.parse("f32[8, -" + "1" * 5000 + "]", MESH), r"dim 1 has size '-1111.*sizes are integers >= 0"),
    (lambda: ShardingType.parse("f32[" + "9" * 20 + "]", MESH), rf"too large; the limit is {MAX_ELEMENTS}"),
    (lambda: ShardingType.parse("f32[4294967296, 4294967296]", MESH), rf"more than {MAX_ELEMENTS} elements"),
    (lambda: ShardingType.parse("f32[8,]", MESH), r"cannot read dim 1 ''"),
    (lambda: ShardingType.parse("f32[8{x},,4]", MESH), r"cannot read dim 1 ''"),
    (lambda: ShardingType.parse("f32[8{x}}]", MESH), r"cannot read dim 0"),
    (lambda: ShardingType.parse("f32[8{x,y]", MESH), r"cannot read dim 0"),
    (lambda: ShardingType.parse(None, MESH), r"a sharding type's text must be a string .*, got NoneType None"),
    (lambda: ShardingType.parse(42, MESH), r"got int 42"),
    (lambda: ShardingType.parse("f32[8]", None), r"parsing 'f32\[8\]' needs a redist.Mesh, got NoneType None"),
    (lambda: ShardingType.parse("f32[8]", "x=2"), r"needs a redist.Mesh, got str 'x=2'"),
    (lambda: ShardingType(None, (8,), "f32", ((),)), r"a sharding type needs a redist.Mesh, got NoneType None"),
    (lambda: ShardingType({"x": 2}, (8,), "f32", ((),)), r"needs a redist.Mesh, got dict"),
    (lambda: ShardingType(MESH, 8, "f32", ((),)), r"shape must be a tuple of dim sizes .*, got int 8"),
    (lambda: ShardingType(MESH, "8", "f32", ((),)), r"shape must be a tuple .*, got str '8'"),
    (lambda: ShardingType(MESH, None, "f32", ()), r"shape must be a tuple"),
    (lambda: ShardingType(MESH, (8.0,), "f32", ((),)), r"dim 0 has size 8.0; sizes are integers >= 0"),
    (lambda: ShardingType(MESH, (2**63,), "f32", ((),)), r"dim 0 has size 9223372036854775808"),
    (lambda: ShardingType(MESH, (2**40, 2**40), "f32", ((), ())), r"more than .* elements"),
    (lambda: ShardingType(MESH, (8,), "f32", None), r"dims must be a tuple with one tuple of mesh axis names"),
    (lambda: ShardingType(MESH, (8,), "f32", ("xy",)), r"the axes of dim 0 must be .*got str 'xy' \(write \('xy',\)"),
    (lambda: ShardingType(MESH, (8,), "f32", ((1,),)), r"the axes of dim 0 must be a tuple of mesh axis names"),
    (lambda: ShardingType(MESH, (8,), "f32", ((),), None), r"the partial axes must be .*got NoneType None"),
    (lambda: ShardingType(MESH, (8,), "f32", ((),), "xy"), r"the partial axes must be .*\(write \('xy',\)"),
    (lambda: ShardingType(MESH, (8,), None, ((),)), r"unsupported dtype None"),  # np.dtype(None) is float64
    (lambda: ShardingType(MESH, (8,), "float128", ((),)), r"unsupported dtype 'float128'"),
    (lambda: ShardingType(MESH, (8,), object(), ((),)), r"unsupported dtype <object object"),
])
def test_bad_types(build, match):
    _raises(build, match)


@pytest.mark.parametrize("spec, match", [
    ((3,), r"entry 0 of partition spec \(3,\) is 3; expected None, a mesh axis name or a tuple of axis names"),
    ((None, (3,)), r"entry 1 of partition spec \(None, \(3,\)\) is \(3,\)"),
    (("x", {"y"}), r"entry 1 .* is \{'y'\}"),
    (3, r"partition spec must be a PartitionSpec or a tuple .*, got int 3"),
    (None, r"partition spec must be a PartitionSpec .*, got NoneType None"),
    ("xy", r"partition spec must be a PartitionSpec .*, got str 'xy'"),
    (P("x", unreduced={"y"}), r"unreduced or reduced axes; give pending sums as partial="),
])
def test_bad_partition_specs(spec, match):
    _raises(lambda: ShardingType.from_partition_spec((8, 4), "f32", spec, MESH), match)


def test_bad_partition_spec_arguments():
    _raises(lambda: ShardingType.from_partition_spec(8, "f32", ("x",), MESH), r"shape must be a tuple .*got int 8")
    _raises(lambda: ShardingType.from_partition_spec(None, "f32", (), MESH), r"shape must be a tuple")
    _raises(lambda: ShardingType.from_partition_spec((8,), "f32", ("x",), None), r"needs a redist.Mesh")
    _raises(lambda: ShardingType.from_partition_spec((8,), "f32", (), MESH, None), r"the partial axes must be")
    # lists stand for tuples, as in the partition specs people write by hand
    assert ShardingType.from_partition_spec([8, 4], "f32", [["x", "y"], None], MESH).dims == (("x", "y"), ())


# ------------------------------------------------------------------------------------------------ planning
def test_bad_topologies():
    uneven_src, uneven_dst = ShardingType.parse("f32[5{x}]", MESH), ShardingType.parse("f32[5{y}]", MESH)
    for src, dst in ((T, U), (uneven_src, uneven_dst), (T, T)):  # also where no candidates are priced
        _raises(lambda: redist.synthesize(src, dst, topology=42),
                r"topology must be a preset name \(tpu-v4, nvlink-8, 2x8-nodes, cpu-host\) or a redist.cost.Topology, "
                r"got int 42")
        _raises(lambda: redist.synthesize(src, dst, topology="tpu"), r"unknown topology preset 'tpu'; known presets")
    partial = cost.Topology("x only", (("x", cost.NVLINK),))
    _raises(lambda: redist.synthesize(T, U, topology=partial), r"topology 'x only' has no link for mesh axis 'y'")
    _raises(lambda: cost.topology(["tpu-v4"], MESH), r"unknown topology preset \['tpu-v4'\]")
    _raises(lambda: cost.Link("fast", 1e9), r"link latency alpha='fast' must be a finite number >= 0 seconds")
    _raises(lambda: cost.Link(1e-6, None), r"link bandwidth beta=None must be a finite number > 0 bytes/s")
    _raises(lambda: cost.Topology("t", 42), r"topology 't': links must be \(mesh axis name, redist.cost.Link\) pairs")
    _raises(lambda: cost.Topology("t", (("x", 1.0),)), r"links must be \(mesh axis name, redist.cost.Link\) pairs")
    plan = redist.synthesize(T, U)
    _raises(lambda: cost.plan_time(plan, 42), r"topology must be a preset name")
    _raises(lambda: cost.plan_time(plan, None), r"plan_time\(\) needs a topology")
    _raises(lambda: cost.plan_time("plan", "tpu-v4"), r"plan_time\(\) takes a redist.Plan, got str 'plan'")
    assert cost.plan_time(plan, "tpu-v4") == cost.plan_time(plan, cost.topology("tpu-v4", MESH)) > 0


@pytest.mark.parametrize("build, match", [
    (lambda: redist.synthesize("a", "b"), r"the source must be a redist.ShardingType .*, got str 'a'"),
    (lambda: redist.synthesize(T, None), r"the destination must be a redist.ShardingType .*, got NoneType None"),
    (lambda: redist.lower_bound_bytes(T, "f32[8]"), r"the destination must be a redist.ShardingType"),
    (lambda: redist.lower_bound_bytes(3, T), r"the source must be a redist.ShardingType .*, got int 3"),
    (lambda: redist.shard("f32[8]", np.zeros(8, np.float32)), r"shard\(\) takes a redist.ShardingType first, got str"),
    (lambda: redist.shard(T, object()), None),  # the words are the data rule's (redist.data)
    (lambda: redist.unshard(None, []), r"unshard\(\) takes a redist.ShardingType first, got NoneType None"),
])
def test_bad_planning_and_data_arguments(build, match):
    _raises(build, match)


# ------------------------------------------------------------------------------------------------ partir_core
PMESH = Mesh({"batch": 2, "model": 4})
MP, AP = pc.ManualPartition, pc.AutomaticPartition


def f(x, w):
    return jnp.tanh(x @ w)


X, W = jnp.arange(8 * 16, dtype=jnp.float32).reshape(8, 16) / 100, jnp.ones((16, 32), jnp.float32)


@pytest.mark.parametrize("build, match", [
    (lambda: MP([0], axis="batch"), r"ManualPartition: dims must be a dict \{path: dim\} like \{'x': 0\}, got list \[0\]"),
    (lambda: MP(None), r"dims must be a dict .*got NoneType None"),
    (lambda: MP({0: 0}), r"ManualPartition: path 0 must be a string like 'params/w1'"),
    (lambda: MP({"x": "0"}), r"the dim of path 'x' must be an int \(or None to pin the input\), got str '0'"),
    (lambda: MP({"x": 0.0}), r"the dim of path 'x' must be an int"),
    (lambda: MP({"x": 0}, axis=None), r"ManualPartition: axis must be a mesh axis name, got None"),
    (lambda: MP({"x": 0}, axis=["batch"]), r"axis must be a mesh axis name, got \['batch'\]"),
    (lambda: AP(time_budget_s="fast"), r"AutomaticPartition: time_budget_s must be a finite number of seconds > 0, got 'fast'"),
    (lambda: AP(time_budget_s=-1), r"time_budget_s must be .*, got -1"),
    (lambda: AP(time_budget_s=0), r"time_budget_s must be .*, got 0"),
    (lambda: AP(time_budget_s=math.nan), r"time_budget_s must be .*, got nan"),
    (lambda: AP(time_budget_s=math.inf), r"time_budget_s must be .*, got inf"),
    (lambda: AP(time_budget_s=True), r"time_budget_s must be .*, got True"),
    (lambda: AP(memory_budget_bytes="1GB"), r"memory_budget_bytes must be a finite number of bytes > 0, or None"),
    (lambda: AP(memory_budget_bytes=math.nan), r"memory_budget_bytes must be .*, got nan"),
    (lambda: AP(memory_budget_bytes=-1), r"memory_budget_bytes must be .*, got -1"),
    (lambda: AP(axes="batch"), r"axes must be a list of mesh axis names like \['batch'\], got 'batch'"),
    (lambda: AP(axes=[0]), r"axes must be a list of mesh axis names"),
    (lambda: AP(seed=1.5), r"seed must be an int, got 1.5"),
    (lambda: AP(max_evals=0), r"max_evals must be an int >= 1, or None, got 0"),
    (lambda: AP(patience="long"), r"patience must be an int >= 1, or None, got 'long'"),
    (lambda: AP(max_depth=2.0), r"max_depth must be an int >= 1, or None, got 2.0"),
    (lambda: AP(exploration=-1), r"exploration must be a finite number >= 0, got -1"),
    (lambda: AP(progress="yes"), r"progress must be True, False or None, got 'yes'"),
    (lambda: AP(hardware="h100"), r"AutomaticPartition: unknown hardware 'h100'; give a preset name \(cpu-host, "
                                  r"tpu-v4, a100-nvlink\) or a partir_core.Hardware"),
])
def test_bad_tactics(build, match):
    _raises(build, match, pc.PartitionError)


@pytest.mark.parametrize("schedule, match", [
    (MP({"x": 0}, axis="batch"), r"a schedule is a list of tactics; put the single tactic in a list: \[ManualPartition"),
    (AP(), r"put the single tactic in a list: \[AutomaticPartition"),
    ("BP", r"a schedule is a list of tactics, got the string 'BP'; preset strategies are built by "
           r"partir_core.schedules.schedule"),
    (None, r"a schedule is a list of tactics \(ManualPartition, AutomaticPartition, Pipeline\), got NoneType None"),
    ([MP({"x": 0}, axis="batch"), "MP"], r"schedule entry 1 is str 'MP', not a tactic"),
    ([MP({"x": 0}, axis="nope")], r"ManualPartition: unknown mesh axis 'nope'; the mesh has axes batch, model"),
    ([AP(axes=["batch", "nope"])], r"AutomaticPartition: unknown mesh axis 'nope'"),
])
def test_bad_schedules(schedule, match):
    _raises(lambda: pc.jit(f, PMESH, schedule), match, pc.PartitionError)


def test_bad_jit_arguments():
    _raises(lambda: pc.jit(3, PMESH, []), r"partir_core.jit needs a function to partition, got int 3", pc.PartitionError)
    _raises(lambda: pc.jit(f, {"batch": 2}, []),
            r"partir_core.jit needs a mesh \(redist.Mesh, jax.sharding.Mesh or AbstractMesh\), got dict", pc.PartitionError)


def test_bad_calls_of_a_partitioned_function():
    pf = pc.jit(f, PMESH, [MP({"x": 0}, axis="batch")])
    fits = r"arguments do not fit f\(x, w\): "
    _raises(lambda: pf(X), fits + r"missing a required argument: 'w'", pc.PartitionError)
    _raises(lambda: pf.lower(w=W), fits + r"missing a required argument: 'x'", pc.PartitionError)
    _raises(lambda: pf(X, W, W), fits + r"too many positional arguments \(given 3 positional\)", pc.PartitionError)
    _raises(lambda: pf(X, W, z=1), fits + r"got an unexpected keyword argument 'z'", pc.PartitionError)
    _raises(lambda: pf(X, W, x=X), fits + r"multiple values for argument 'x'", pc.PartitionError)
    _raises(lambda: pf("abc", W), r"input 'x' is str 'abc'; inputs are arrays or numbers", pc.PartitionError)
    _raises(lambda: pf(X, w=object()), r"input 'w' is object <object", pc.PartitionError)
    _raises(lambda: pf(np.array(["a"] * 8), W), r"input 'x' has dtype <U1; inputs are arrays of numbers",
            pc.PartitionError)
    _raises(lambda: pf(np.ma.masked_array(X, mask=X > 0), W), r"input 'x' is a masked array: masked arrays are not "
            r"supported \(the mask would be lost\); pass x.filled\(value\), or the data and the mask as two inputs",
            pc.PartitionError)


def test_bad_questions_to_a_partitioned_program():
    low = pc.jit(f, PMESH, [MP({"x": 0}, axis="batch")]).lower(X, W)
    presets = r"give a preset name \(cpu-host, tpu-v4, a100-nvlink\) or a partir_core.Hardware"
    _raises(lambda: low.simulate("bogus"), r"unknown hardware 'bogus'; " + presets)
    _raises(lambda: low.simulate(42), r"unknown hardware 42; " + presets)
    _raises(lambda: low.after(2), r"after\(2\): k must be an int from 0 to 1", pc.PartitionError)
    _raises(lambda: low.after(-1), r"after\(-1\)", pc.PartitionError)
    _raises(lambda: low.after("1"), r"after\('1'\)", pc.PartitionError)
    _raises(lambda: low.input_type("params/w"), r"no input is named 'params/w'; inputs are x, w", pc.PartitionError)
    assert low.simulate("tpu-v4").hardware == "tpu-v4" and low.simulate(pc.HARDWARE["tpu-v4"]).hardware == "tpu-v4"


def test_bad_preset_schedules():
    m, ins, _ = model_and_inputs("mlp")
    _raises(lambda: schedules.schedule(None, m, ins), r"a schedule name is a string like 'BP\+MP', got NoneType",
            pc.PartitionError)
    _raises(lambda: schedules.schedule("BP+XP", m, ins), r"unknown schedule 'XP' in 'BP\+XP'; presets: BP, MP",
            pc.PartitionError)
    _raises(lambda: schedules.schedule("MP", m, ins, model_axis="tensor", mesh=PMESH),
            r"unknown mesh axis 'tensor'; the mesh has axes batch, model", pc.PartitionError)
    _raises(lambda: schedules.schedule("EMB", m, ins), r"embedding found no embedding table \(a parameter read by a "
            r"gather of data indices\) in mlp_step", pc.PartitionError)


# ------------------------------------------------------------------------------------------------ keyword calls
needs_8 = pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 JAX devices (tests/conftest.py sets XLA_FLAGS)")


@needs_8
def test_keyword_calls_bind_like_the_function():
    """``pf(x=..., w=...)`` and ``pf.lower(x=..., w=...)`` bind as ``f`` does: the same program (one lowering,
    cached) and the same result as a positional call."""
    pf = pc.jit(f, PMESH, [MP({"x": 0}, axis="batch"), MP({"w": 1}, axis="model")])
    low = pf.lower(X, W)
    assert pf.lower(x=X, w=W) is low and pf.lower(X, w=W) is low and pf.lower(w=W, x=X) is low
    assert low.graph.in_paths == ["x", "w"]
    assert str(low.input_type("w")) == "f32[16, 32{model}]"
    want = f(X, W)
    for got in (pf(x=X, w=W), pf(w=W, x=X), pf(X, w=W)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)


@needs_8
def test_keyword_only_and_var_keyword_parameters():
    """Keyword-only parameters are named by their name, entries of ``**extra`` by ``extra/key``."""
    def g(x, *, scale, **extra):
        return x * scale + extra["shift"]

    pf = pc.jit(g, PMESH, [MP({"x": 0, "scale": 0, "extra/shift": 1}, axis="batch")])
    scale, shift = jnp.full((8, 16), 2.0), jnp.ones((8, 16))
    low = pf.lower(X, shift=shift, scale=scale)
    assert low.graph.in_paths == ["x", "scale", "extra/shift"]
    assert [str(low.input_type(p)) for p in low.graph.in_paths] == ["f32[8{batch}, 16]"] * 2 + ["f32[8, 16{batch}]"]
    np.testing.assert_allclose(np.asarray(pf(X, scale=scale, shift=shift)), np.asarray(g(X, scale=scale, shift=shift)))
    _raises(lambda: pf(X, shift=shift), r"missing a required argument: 'scale'", pc.PartitionError)
