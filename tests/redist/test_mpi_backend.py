"""The MPI runtime (redist.mpi): real mpiexec launches of tests/redist/mpi_worker.py, checked from their output.

Each launch runs many cases in one job (startup is the slow part); see the worker for what each mode does.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.redist.mpi_launch import MPIEXEC, ROOT
from tests.redist.mpi_launch import mpirun as launch

pytestmark = [pytest.mark.mpi, pytest.mark.skipif(
    not os.path.exists(MPIEXEC), reason=f"no mpiexec in this environment ({MPIEXEC}); install the mpich wheel")]


def mpirun(n: int, *args: str, timeout: float = 300) -> tuple[subprocess.CompletedProcess, float]:
    proc, seconds, hung = launch(n, *args, timeout=timeout)
    if hung:
        pytest.fail(f"mpiexec -n {n} {' '.join(args)} hung for {timeout} s; output:\n"
                    f"{(proc.stdout + proc.stderr)[-6000:]}")
    return proc, seconds


def summary(proc, pattern: str) -> dict[str, str]:
    out = proc.stdout + proc.stderr
    m = re.search(pattern, out)
    assert proc.returncode == 0 and m, f"exit {proc.returncode}; output:\n{out[-6000:]}"
    return m.groupdict()


def test_import_redist_does_not_import_mpi4py():
    code = "import sys, redist; assert 'mpi4py' not in sys.modules, 'redist imported mpi4py'"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=120)


@pytest.mark.parametrize("n", [4, 6, 8])
def test_random_and_classic_reshards_match_numpy_backend(n):
    """Even cases, then uneven ones (random pairs with padding and named cases, uneven reduce-scatters among
    them), then pairs that create pending sums, in the same job; poisoned padding; every reduction kind,
    device orders on both sides, complex dtypes."""
    proc, _ = mpirun(n, "cases", str(100 + n), "400", "100", "60")
    got = summary(proc, r"ranks=(?P<ranks>\d+) cases=(?P<cases>\d+) passed=(?P<passed>\d+) "
                        r"core_mismatch=(?P<core>\d+) subcomms_stable=(?P<stable>\d)")
    assert int(got["ranks"]) == n
    assert int(got["cases"]) >= 400
    assert got["passed"] == got["cases"], proc.stdout[-6000:]
    assert got["core"] == "0", "the numpy backend disagrees with unshard:\n" + proc.stdout[-6000:]
    assert got["stable"] == "1", "repeated reshards created new sub-communicators"
    uneven = summary(proc, r"uneven cases=(?P<cases>\d+) passed=(?P<passed>\d+) exchanges=(?P<exchanges>\d+)")
    assert int(uneven["cases"]) >= 100
    assert uneven["passed"] == uneven["cases"], proc.stdout[-6000:]
    assert int(uneven["exchanges"]) >= 10, proc.stdout[-6000:]
    creation = summary(proc, r"creation cases=(?P<cases>\d+) passed=(?P<passed>\d+) created=(?P<created>\d+)")
    assert creation["passed"] == creation["cases"], proc.stdout[-6000:]
    assert int(creation["created"]) >= 20, proc.stdout[-6000:]
    kinds = re.search(r"instructions run: (.*)", proc.stdout).group(1)
    for kind in ("Slice", "AllGather", "AllToAll", "ReduceScatter", "AllReduce", "CollectivePermute", "Exchange",
                 "KeepRoot", "EmbedChunk"):
        assert f"{kind}=" in kinds, f"no {kind} ran: {kinds}"
    features = re.search(r"features run: (.*)", proc.stdout).group(1)
    for feature in ("partial(sum)", "partial(max)", "partial(min)", "partial(prod)", "device order", "reordered mesh",
                    "c64", "c128", "own row packed from the input", "own row unpacked from the input"):
        assert f"{feature}=" in features, f"no case with {feature} ran: {features}"


def test_argument_errors_raise_on_every_rank():
    proc, _ = mpirun(4, "errors", timeout=120)
    got = summary(proc, r"errors=(?P<errors>\d+) all_raised=(?P<raised>\d+)")
    assert got["raised"] == got["errors"], proc.stdout
    assert "the communicator has 4 ranks but mesh x=8 has 8 devices" in proc.stdout
    assert "different arguments on different ranks" in proc.stdout
    assert "the local buffer on rank(s) [2] does not match" in proc.stdout
    assert "comm must be an MPI intracommunicator such as MPI.COMM_WORLD (one rank per device), got str 'x'" \
        in proc.stdout
    assert "needs ShardingType src and dst, got NoneType None" in proc.stdout
    assert ("run_program: instruction 0 of the program: AllToAll on a local buffer of shape (1, 4): the leading dim "
            "must hold the 4 chunks of its group") in proc.stdout
    assert ("the local buffer on rank(s) [0] does not match src f64[8{x}, 4] (expected shape (4, 4), dtype "
            "float64); on this rank (rank 0) it has dtype complex128, expected float64") in proc.stdout
    assert "on this rank (rank 0) it is a masked array: masked arrays are not supported" in proc.stdout


@pytest.mark.parametrize("n", [2, 4])
def test_agreement_runs_once_per_combination_and_mismatches_still_raise_everywhere(n):
    """The full agreement (an Allgather) runs on the first call of a combination, on every disagreement (which
    forgets the agreements) and when a rank asks with ``check=True``; otherwise a call agrees through the
    verdict alone, which travels while the plan runs. Ranks that call different combinations they had each
    agreed on before (so that each runs a different plan on ahead), or an agreed one with a bad buffer on one
    rank, all raise (none hangs), and the communicator stays usable. An agreement is found again by identity
    (the last combination called) and by value (equal types, other objects); a disagreement forgets both. One combination is a gather that runs
    without the interpreter (mpi_channels.direct; forced however many ranks share a core)."""
    proc, _ = mpirun(n, "allgather", "agreement", timeout=120)
    got = summary(proc, r"agreement full=(?P<full>\d+) expected=(?P<expected>\d+) errors=(?P<errors>\d+) "
                        r"all_raised=(?P<raised>\d+) correct=(?P<correct>\d) of (?P<calls>\d+) direct=(?P<direct>\d) "
                        r"forgotten=(?P<forgotten>\d)")
    assert got["full"] == got["expected"], proc.stdout
    assert got["raised"] == got["errors"] == "5", proc.stdout
    assert got["correct"] == "1" and int(got["calls"]) == 14, proc.stdout
    assert got["direct"] == "1", proc.stdout
    assert got["forgotten"] == "1", proc.stdout  # after a disagreement, on every rank
    assert "different arguments on different ranks (rank groups [[0], [1" in proc.stdout
    assert "the local buffer on rank(s) [1] does not match" in proc.stdout


@pytest.mark.parametrize("n", [3, 4])
def test_even_pending_sums_equal_the_numpy_backend_bit_for_bit(n):
    """A pending sum scattered evenly is reduced by numpy in group order, as the numpy backend reduces it:
    fractional values (NaN among them for max and min) of every float and complex dtype agree exactly."""
    proc, _ = mpirun(n, "exact_sums", timeout=120)
    got = summary(proc, r"exact sums cases=(?P<cases>\d+) equal=(?P<equal>\d+)")
    assert int(got["cases"]) == 36 and got["equal"] == got["cases"], proc.stdout


def test_personalised_exchanges_in_windows_of_one_shift():
    """A group's all-gathers, all-to-alls and even reduce-scatters post their transfers a window of shifts at a
    time (mpi_backend.WINDOW, 32: more than this machine's ranks); with windows of one shift each, every case
    still matches the numpy backend and even sums still agree bit for bit."""
    proc, _ = mpirun(4, "windowed", "cases", "41", "60")
    got = summary(proc, r"ranks=(?P<ranks>\d+) cases=(?P<cases>\d+) passed=(?P<passed>\d+)")
    assert int(got["cases"]) >= 60 and got["passed"] == got["cases"], proc.stdout[-6000:]
    kinds = re.search(r"instructions run: (.*)", proc.stdout).group(1)
    for kind in ("AllGather", "AllToAll", "ReduceScatter"):
        assert f"{kind}=" in kinds, f"no {kind} ran: {kinds}"
    proc, _ = mpirun(4, "windowed", "exact_sums", timeout=120)
    got = summary(proc, r"exact sums cases=(?P<cases>\d+) equal=(?P<equal>\d+)")
    assert int(got["cases"]) == 36 and got["equal"] == got["cases"], proc.stdout


def test_all_gathers_by_mpi_allgather():
    """An all-gather into contiguous places is MPI's Iallgather where a core runs few ranks
    (mpi_placement.ALLGATHER_RANKS_PER_CORE, ALLGATHER_MAX_BYTES); forced on 6 ranks (groups of 2, 3 and 6),
    every case still matches the numpy backend."""
    proc, _ = mpirun(6, "allgather", "cases", "47", "150", "30", "20")
    got = summary(proc, r"ranks=(?P<ranks>\d+) cases=(?P<cases>\d+) passed=(?P<passed>\d+)")
    assert int(got["cases"]) >= 150 and got["passed"] == got["cases"], proc.stdout[-6000:]
    features = re.search(r"features run: (.*)", proc.stdout).group(1)
    count = int(re.search(r"all-gather by MPI's Allgather=(\d+)", features).group(1))
    assert count >= 10, features


def test_receives_straight_into_strided_places():
    """An all-gather along an inner dim receives each member's chunk straight into its strided place in the
    result, and an all-to-all whose rows a transpose unpacks receives them straight into the transpose's result,
    where the places' runs are long enough (mpi_placement.STRIDED_RUN_MIN bytes); with every place received
    directly, however short its runs, every case still matches the numpy backend, even sums bit for bit."""
    proc, _ = mpirun(4, "strided", "cases", "43", "200", "40", "20")
    got = summary(proc, r"ranks=(?P<ranks>\d+) cases=(?P<cases>\d+) passed=(?P<passed>\d+)")
    assert int(got["cases"]) >= 200 and got["passed"] == got["cases"], proc.stdout[-6000:]
    features = re.search(r"features run: (.*)", proc.stdout).group(1)
    for feature in ("all-to-all rows received in place", "all-gather chunks received in place",
                    "own row packed from the input", "partial(sum)", "c128"):
        assert f"{feature}=" in features, f"no case with {feature} ran: {features}"
    proc, _ = mpirun(4, "strided", "exact_sums", timeout=120)
    got = summary(proc, r"exact sums cases=(?P<cases>\d+) equal=(?P<equal>\d+)")
    assert int(got["cases"]) == 36 and got["equal"] == got["cases"], proc.stdout


def test_results_are_new_arrays_and_lossless_inputs_are_accepted():
    proc, _ = mpirun(4, "fresh", timeout=120)
    got = summary(proc, r"fresh plans=(?P<plans>\d+) fresh=(?P<fresh>\d+) lossless inputs=(?P<inputs>\d+) "
                        r"accepted=(?P<accepted>\d+)")
    assert got["fresh"] == got["plans"] == "5", proc.stdout
    assert got["accepted"] == got["inputs"], proc.stdout
    assert "['permute'] fresh=1" in proc.stdout and "['pad', 'permute', 'unpad'] fresh=1" in proc.stdout


def test_nothing_after_the_block_runs_on_a_failing_rank(tmp_path):
    """The failing rank ends inside abort_on_error: MPI_Abort can return before the job is killed, and the
    code after the block must not run meanwhile. Without a failure every rank writes its marker (so the check
    can see a marker at all)."""
    marker = str(tmp_path / "after")
    proc, _ = mpirun(4, "after_block", marker, "-1", timeout=60)
    assert proc.returncode == 0 and sorted(os.listdir(tmp_path)) == [f"after.{r}" for r in range(4)], proc.stderr
    for f in tmp_path.iterdir():
        f.unlink()
    proc, _ = mpirun(4, "after_block", marker, "1", timeout=60)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "injected failure on rank 1 inside abort_on_error" in out and "aborting all 4 ranks" in out
    assert os.listdir(tmp_path) == [], f"code after the block ran: {os.listdir(tmp_path)}\n{out}"


def test_reshards_of_numpys_largest_rank_and_a_program_past_it_refused_on_every_rank():
    proc, _ = mpirun(4, "high_rank", timeout=120)
    got = summary(proc, r"high_rank cases=(?P<cases>\d+) passed=(?P<passed>\d+) refused=(?P<refused>\d)")
    assert got["passed"] == got["cases"] == "4" and got["refused"] == "1", proc.stdout
    assert "redist.mpi.reshard: the program holds buffers of 65 dims" in proc.stdout


@pytest.mark.parametrize("n, rank, code, status", [(2, 1, "0", 0), (3, 0, "none", 0), (4, 3, "3", 3)])
def test_a_rank_that_exits_inside_abort_on_error_aborts_every_rank(n, rank, code, status):
    """An SPMD program where one rank exits early is an error whatever its status: the others would wait for
    it in a collective forever (sys.exit(0) too, which would otherwise pass through abort_on_error and hang the job)."""
    proc, seconds = mpirun(n, "exit_in_block", str(rank), code, timeout=60)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert (f"[rank {rank}] redist.mpi.abort_on_error: rank {rank} left the block by sys.exit with status "
            f"{status}, and the other ranks would wait for it: aborting all {n} ranks") in proc.stderr, out
    assert "every rank got past the block" not in out


def test_memory_within_twice_the_larger_local_buffer():
    """Cold and warm calls stay within 2 x max(src, dst) local bytes, the scratch buffer kept between calls
    counted."""
    proc, _ = mpirun(4, "memory", timeout=120)
    got = summary(proc, r"memory cases=(?P<cases>\d+) within=(?P<within>\d+) worst_ratio=(?P<ratio>[\d.]+)")
    assert got["within"] == got["cases"], proc.stdout
    assert float(got["ratio"]) <= 2.01, proc.stdout
    figures = {pair: (float(extra), float(allocated), float(held)) for pair, extra, allocated, held in re.findall(
        r"^\s*(\S.*?) \[.*?\]: extra \d+ B = ([\d.]+) x .*?\(allocated ([\d.]+) x, scratch held ([\d.]+) x",
        proc.stdout, re.M)}
    # A permute and an all-reduce of a partial input: the result alone (the all-reduce runs in place on it).
    for pair in ("f64[1024{x}, 1024] -> f64[1024{y}, 1024]", "f64[512, 1024{y}] partial{x} -> f64[512, 1024{y}]"):
        assert figures[pair][0] <= 1.01, proc.stdout
    # A slab transpose: packed into the scratch buffer, exchanged out of place into the result; a warm call
    # allocates nothing but its result.
    extra, allocated, held = figures["f64[1024{x,y}, 1024] -> f64[1024, 1024{x,y}]"]
    assert allocated <= 1.01 and 0.99 <= held <= 1.01 and extra <= 2.01, proc.stdout
    # A gather along an inner dim (2 KiB runs): each chunk straight into its place in the result, no temporary.
    assert figures["f64[1024, 1024{x,y}] -> f64[1024, 1024]"][0] <= 1.01, proc.stdout
    # An uneven gather of rows: each rank's rows go straight from its input into every result (no send or
    # receive buffer).
    assert figures["f64[1023{x,y}, 1024] -> f64[1023, 1024]"][0] <= 1.01, proc.stdout


def test_failure_mid_plan_aborts_every_rank():
    proc, seconds = mpirun(4, "fail", timeout=60)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "injected failure on rank 0 before instruction 2" in out
    assert "aborting all 4 ranks" in out
    assert "no failure happened" not in out
    assert seconds < 60
