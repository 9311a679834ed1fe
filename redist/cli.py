"""redist: synthesize memory-bounded redistribution plans, prove them with Z3, run them.

    redist plan SRC DST --mesh x=2,y=4 [--dst-mesh MESH] [--topology NAME] [--json | --program] [--show]
                [--plot FILE]
    redist verify SRC DST --mesh x=2,y=4 [--dst-mesh MESH] [--topology NAME] [--claim TYPE] [--timeout SECONDS]
    redist verify --plan FILE [--claim TYPE] [--timeout SECONDS]
    redist demo [--backends numpy,jax,mpi]
    redist --version

'plan --json' writes a plan file that 'verify --plan' reads back ('-' reads standard input), so a plan can
be computed once, checked in, reviewed and verified again. 'plan --show' draws which block every device holds
after each step; '--plot FILE' draws the same as a figure (.png or .svg; needs matplotlib, redist[bench]).
'--dst-mesh' reads DST on another mesh (another device order, other devices, other axes: a pipeline stage's,
a resized job's), for a plan that moves the array there; its default is --mesh.

A plan file is at most 64 MiB. Exit status: 0 done ('verify': proved), 1 'verify' refuted (or a demo check
failed), 2 a usage error, bad input or output that cannot be written (standard output closed, a full disk),
3 'verify' undecided ('--timeout' ran out), 141 the reader of the output went away (a broken pipe: 'redist
plan ... | head' stops quietly, as Unix tools do). Every error is one line on stderr, 'redist: error: ...';
never a traceback.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

from redist import __version__, demo
from redist.cost import plan_time
from redist.errors import ShardingError
from redist.mesh import Mesh
from redist.plan import Plan
from redist.plan_file import file_text
from redist.synthesis import synthesize
from redist.types import ShardingType
from redist.verify import verify

EXIT_STATUS = {"proved": 0, "refuted": 1, "undecided": 3}
BROKEN_PIPE_STATUS = 128 + 13  # what a shell reports for a process ended by SIGPIPE, as Unix tools are
PLAN_FILE_LIMIT = 64 * 2**20  # bytes: a plan file lists steps and a mesh's devices; a larger one is no plan file


def cmd_plan(args) -> int:
    if args.json and (args.program or args.show):
        flag = "--program" if args.program else "--show"
        raise _UsageError(f"redist plan: error: --json writes a plan file, which holds no program and no pictures; "
                          f"use {flag} without --json")
    plan = _synthesize(args)
    if args.plot is not None:
        plan.plot(args.plot)
    if args.json:
        _write(file_text(plan))
        return 0
    _say(*_meshes(plan), plan.show() if args.show else plan)
    if args.topology is not None:
        _say(f"modeled time    {plan_time(plan, args.topology) * 1e6:.1f} us on {args.topology}")
    if args.plot is not None:
        _say(f"figure          {args.plot}")
    if args.program:
        _say(*plan.stages)
    return 0


def cmd_verify(args) -> int:
    if args.plan is not None:
        if args.src is not None or args.mesh is not None or args.dst_mesh is not None or args.topology is not None:
            raise _UsageError("redist verify: error: give either SRC DST --mesh MESH [--dst-mesh MESH] "
                              "[--topology NAME] or --plan FILE, not both (a plan file names its own meshes)")
        plan = _read_plan_file(args.plan)
    elif args.dst is None or args.mesh is None:
        raise _UsageError("redist verify: error: give SRC DST --mesh MESH, or --plan FILE")
    else:
        plan = _synthesize(args)
    claim_type = None
    if args.claim is not None:
        try:
            claim_type = ShardingType.parse(args.claim, plan.dst.mesh)
        except ShardingError as e:
            raise ShardingError(f"--claim: {e}") from None
    verdict = verify(plan, claim_type, timeout_s=args.timeout)
    claim = f" the claim {args.claim}" if args.claim is not None else ""
    _say(*_meshes(plan), plan, f"verify: {verdict.status}{claim} in {verdict.seconds:.2f} s",
         f"  {verdict.reason}")
    if verdict.counterexample is not None:
        _say("counterexample: " + ", ".join(f"{k} {v}" for k, v in verdict.counterexample.items()))
    return EXIT_STATUS[verdict.status]


def cmd_demo(args) -> int:
    return demo.main(backends=args.backends, say=_say)


def _meshes(plan: Plan) -> list[str]:
    """``mesh MESH``, and ``dst mesh MESH`` where the destination is on another mesh."""
    lines = [f"mesh {plan.src.mesh}"]
    return lines + [f"dst mesh {plan.dst.mesh}"] if plan.dst.mesh != plan.src.mesh else lines


def _synthesize(args) -> Plan:
    mesh = Mesh.parse(args.mesh)
    dst_mesh = mesh if args.dst_mesh is None else _dst_mesh(args.dst_mesh)
    return synthesize(ShardingType.parse(args.src, mesh), ShardingType.parse(args.dst, dst_mesh),
                      topology=args.topology)


def _dst_mesh(text: str) -> Mesh:
    try:
        return Mesh.parse(text)
    except ShardingError as e:
        raise ShardingError(f"--dst-mesh: {e}") from None


def _read_plan_file(path: str) -> Plan:
    """The plan in the file ``path`` ('-': standard input), read up to :data:`PLAN_FILE_LIMIT` bytes (so that a
    file that never ends, /dev/zero say, is refused too)."""
    if path == "-" and sys.stdin is None:
        raise ShardingError("cannot read the plan file from standard input: it is closed")
    try:
        if path == "-":  # its bytes, or its text where it has no bytes (replaced by a text stream in-process)
            data = getattr(sys.stdin, "buffer", sys.stdin).read(PLAN_FILE_LIMIT + 1)
        else:
            with open(path, "rb") as f:
                data = f.read(PLAN_FILE_LIMIT + 1)
        if len(data) > PLAN_FILE_LIMIT:
            raise ShardingError(f"the plan file {path!r} is larger than {PLAN_FILE_LIMIT // 2**20} MiB, the most "
                                "redist reads")
        text = data if isinstance(data, str) else data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ShardingError(f"cannot read the plan file {path!r}: {e}") from None
    return Plan.from_json(text)


def _say(*lines) -> None:
    """Print ``lines`` on standard output, as :func:`_write` writes."""
    _write("".join(f"{line}\n" for line in lines))


def _write(text: str) -> None:
    """Write ``text`` on standard output. Raises :class:`_OutputError` where it cannot take it (a full disk, a
    closed descriptor); BrokenPipeError passes (the reader went away: :func:`main` stops quietly)."""
    try:
        sys.stdout.write(text)
    except BrokenPipeError:
        raise
    except OSError as e:
        raise _OutputError(f"cannot write to standard output: {e}") from None


def _flush() -> None:
    """What is still buffered on standard output, written, with :func:`_write`'s errors."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as e:
        raise _OutputError(f"cannot write to standard output: {e}") from None


def _discard_output() -> None:
    """Point standard output at the null device after it failed, so that what is still buffered goes nowhere
    when Python flushes it at exit (which would report the failure again, with a traceback)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # no descriptor of its own (output captured in-process)
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)


class _UsageError(Exception):
    """A command line argparse cannot read (raised by :class:`_Parser` instead of printing usage and exiting)."""


class _OutputError(Exception):
    """Standard output is closed or cannot be written."""


class _Parser(argparse.ArgumentParser):
    """argparse, with its usage errors reported the way :func:`main` reports every error: in one line."""

    def error(self, message):
        raise _UsageError(f"{self.prog}: error: {message} (see '{self.prog} --help')")


def _one_line(text: str) -> str:
    return "; ".join(line.strip() for line in str(text).splitlines() if line.strip())


def main(argv=None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); returns the exit status of the module
    docstring. Errors are reported in one line on stderr."""
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
        if sys.stdout is None:  # `redist ... >&-`: Python found no descriptor 1 to write to
            raise _OutputError("standard output is closed")
        status = args.func(args)
        _flush()
        return status
    except BrokenPipeError:
        _discard_output()
        return BROKEN_PIPE_STATUS
    except _OutputError as e:
        if sys.stdout is not None:
            _discard_output()
        _complain(f"redist: error: {e}")
    except _UsageError as e:
        _complain(_one_line(e))
    except (ShardingError, ImportError) as e:  # bad input, or a missing extra (the message names it)
        _complain(f"redist: error: {_one_line(e)}")
    except KeyboardInterrupt:
        _complain("redist: interrupted")
        return 130
    except Exception as e:  # a bug of ours: still one line, and the words to report it with
        _complain(f"redist: error: internal error {type(e).__name__}: {_one_line(e)} (please report this)")
    return 2


def _complain(line: str) -> None:
    """Print ``line`` on stderr, where it can be written: not where stderr is closed (``2>&-``: ``print`` would
    write it on stdout, into the output the user redirected, a plan file say) or cannot take it (a full disk), so
    that the exit status still tells."""
    if sys.stderr is None:
        return
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        pass


def _seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds < math.inf:
        raise argparse.ArgumentTypeError(f"not a number of seconds > 0: {text!r}")
    return seconds


def _build_parser() -> argparse.ArgumentParser:
    # The module docstring is the --help text, hence plain text (docs/spec.md §7 states the contract).
    parser = _Parser(prog="redist", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"redist {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    topology = dict(metavar="NAME", help="choose the fastest plan under this cost model preset (tpu-v4, nvlink-8, "
                                         "2x8-nodes, cpu-host) instead of the one that receives the fewest bytes")
    dst_mesh = dict(metavar="MESH", help="the mesh DST is on (default: --mesh), e.g. x=4,device_ids=[4,5,6,7] or "
                                         "a=2,b=4: the array moves to other devices or another arrangement")
    p = sub.add_parser("plan", help="synthesize and print a redistribution plan")
    p.add_argument("src", help="source type, e.g. 'f32[1024{x}, 512]'")
    p.add_argument("dst", help="destination type, e.g. 'f32[1024, 512{x}]'")
    p.add_argument("--mesh", required=True, help="mesh axes, e.g. x=2,y=4")
    p.add_argument("--dst-mesh", **dst_mesh)
    p.add_argument("--topology", **topology)
    p.add_argument("--json", action="store_true", help="print the plan as a plan file (redist verify --plan reads it)")
    p.add_argument("--program", action="store_true", help="also print the lowered buffer program")
    p.add_argument("--show", action="store_true", help="print the plan step by step with the blocks each device "
                                                        "holds after every step")
    p.add_argument("--plot", metavar="FILE", help="draw the plan as a figure into FILE (.png or .svg; needs "
                                                  "matplotlib: pip install 'redist[bench]')")
    p.set_defaults(func=cmd_plan)
    v = sub.add_parser("verify", help="prove a plan correct with Z3 (exit 0 proved, 1 refuted, 3 undecided)",
                       description="Synthesize SRC -> DST on --mesh, or read --plan FILE, and prove its lowered "
                                   "program correct. Exit status 0 proved, 1 refuted, 2 usage, 3 undecided.")
    v.add_argument("src", nargs="?", help="source type (with DST and --mesh)")
    v.add_argument("dst", nargs="?", help="destination type")
    v.add_argument("--mesh", help="mesh axes, e.g. x=2,y=4")
    v.add_argument("--dst-mesh", **dst_mesh)
    v.add_argument("--topology", **topology)
    v.add_argument("--plan", metavar="FILE", help="verify a plan file written by 'redist plan --json' (- for stdin)")
    v.add_argument("--claim", metavar="TYPE", help="check the claim that the plan turns its source into TYPE (on "
                                                   "the destination's mesh) instead; a false claim is refuted with "
                                                   "a counterexample")
    v.add_argument("--timeout", type=_seconds, metavar="SECONDS", help="give up after this long (exit 3)")
    v.set_defaults(func=cmd_verify)
    d = sub.add_parser("demo", help="plan, verify and run classic reshards on every backend")
    d.add_argument("--backends", default="numpy,jax,mpi", help="comma-separated: numpy,jax,mpi")
    d.set_defaults(func=cmd_demo)
    return parser


if __name__ == "__main__":
    sys.exit(main())
