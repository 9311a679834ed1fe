"""Command line: ``redist plan SRC DST --mesh x=2,y=4`` prints a plan; ``redist demo`` runs the demo.

Every error (a usage error, bad input, or a failure inside) is one line on stderr, ``redist: error: ...``, and
exit status 2; never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys

from redist.bounds import lower_bound_bytes
from redist.errors import ShardingError
from redist.mesh import Mesh
from redist.synthesis import synthesize
from redist.types import ShardingType


def _plan_report(plan, lower_bound: int) -> dict:
    bound = max(plan.src.local_bytes, plan.dst.local_bytes)
    return {
        **plan.to_dict(),
        "memory_bound_bytes": bound,
        "lower_bound_bytes": lower_bound,
        "program": [str(ins) for ins in plan.program.instructions],
    }


def cmd_plan(args) -> int:
    mesh = Mesh.parse(args.mesh)
    src = ShardingType.parse(args.src, mesh)
    dst = ShardingType.parse(args.dst, mesh)
    plan = synthesize(src, dst)
    lb = lower_bound_bytes(src, dst)
    if args.json:
        print(json.dumps(_plan_report(plan, lb), indent=2))
        return 0
    bound = max(src.local_bytes, dst.local_bytes)
    print(f"mesh {mesh}")
    print(plan)
    print(f"peak memory     {plan.peak_bytes} B per device (bound max(src, dst) = {bound} B)")
    ratio = f"{plan.bytes_received / lb:.3f}x" if lb else ("exact" if plan.bytes_received == 0 else "n/a")
    print(f"bytes received  {plan.bytes_received} B per device (lower bound {lb} B, {ratio})")
    if args.program:
        print(plan.program)
    return 0


def cmd_demo(args) -> int:
    from redist.demo import main as demo_main

    return demo_main(backends=args.backends)


class _UsageError(Exception):
    """A command line argparse cannot read (raised by :class:`_Parser` instead of printing usage and exiting)."""


class _Parser(argparse.ArgumentParser):
    """argparse, with its usage errors reported the way :func:`main` reports every error: in one line."""

    def error(self, message):
        raise _UsageError(f"{self.prog}: error: {message} (see '{self.prog} --help')")


def _one_line(text: str) -> str:
    return "; ".join(line.strip() for line in str(text).splitlines() if line.strip())


def main(argv=None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); returns the exit status (0 done, 1 a demo
    check failed, 2 an error, reported in one line on stderr)."""
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
        return args.func(args)
    except _UsageError as e:
        print(_one_line(e), file=sys.stderr)
    except ShardingError as e:
        print(f"redist: error: {_one_line(e)}", file=sys.stderr)
    except KeyboardInterrupt:
        print("redist: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug of ours: still one line, and the words to report it with
        print(f"redist: error: internal error {type(e).__name__}: {_one_line(e)} (please report this)", file=sys.stderr)
    return 2


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="redist", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan", help="synthesize and print a redistribution plan")
    p.add_argument("src", help="source type, e.g. 'f32[1024{x}, 512]'")
    p.add_argument("dst", help="destination type, e.g. 'f32[1024, 512{x}]'")
    p.add_argument("--mesh", required=True, help="mesh axes, e.g. x=2,y=4")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--program", action="store_true", help="also print the lowered buffer program")
    p.set_defaults(func=cmd_plan)
    d = sub.add_parser("demo", help="plan, verify and run classic reshards on every backend")
    d.add_argument("--backends", default="numpy,jax,mpi", help="comma-separated: numpy,jax,mpi")
    d.set_defaults(func=cmd_demo)
    return parser


if __name__ == "__main__":
    sys.exit(main())
