"""Mesh and type text, as a hostile user writes it: random, mutated from valid texts (a span dropped, repeated
hundreds of times, swapped or replaced; whitespace added), and huge or deeply nested. Each text parses, and
its printed form parses back to the same mesh or type, or it raises :class:`redist.ShardingError`; either way
within CPU time linear in its length (:data:`SECONDS_PER_BYTE` past :data:`PARSE_ALLOWANCE_S`), which the huge
texts, that a backtracking pattern or a scan per item would read in quadratic time, try."""

from __future__ import annotations

import random
import time

from proofs.probe.tally import Tally, case_rng, unexpected
from redist.errors import ShardingError
from redist.mesh import Mesh
from redist.testing import SeededDraw, draw_mesh, draw_pair
from redist.types import REDUCTIONS, ShardingType

SECONDS_PER_BYTE = 5e-6  # CPU seconds per byte of text: ten times the slowest measured
PARSE_ALLOWANCE_S = 0.05

MESH_TOKENS = ("x", "y", "z", "a0", "_", "=", "2", "4", "1", "0", "8", "16", ",", " ", "[", "]", "device_ids=[",
               "device_ids", "-", "3", "9" * 12, "\t", "x=2", "y=4", "é", "²", "٢", "(", ")", ":", "\n",
               "2147483648")
TYPE_TOKENS = ("f32", "i32", "bool", "c64", "f16", "bf16", "[", "]", "{", "}", ",", " ", "8", "4", "0", "7", "x",
               "y", "z", ":", "(", ")", "(1)", "(2)2", "x:(1)2", "partial", " partial{", "sum", "max", "prod",
               "min", "-1", "9" * 25, "٨", "\n", "{x}", "{y,x}", "8{x}", "f32[", "]]")


def mutated(rng: random.Random, text: str, tokens) -> str:
    """``text`` changed by one (most often) to three random edits: a span dropped, repeated (up to 500 times),
    swapped end for end, or replaced by one of ``tokens``, or a token inserted."""
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        i = rng.randint(0, len(text))
        j = rng.randint(i, min(len(text), i + 8))
        edit = rng.choice(("drop", "repeat", "insert", "swap", "replace"))
        if edit == "drop":
            text = text[:i] + text[j:]
        elif edit == "repeat":
            text = text[:i] + text[i:j] * rng.choice((2, 3, 50, 500)) + text[j:]
        elif edit == "insert":
            text = text[:i] + rng.choice(tokens) + text[i:]
        elif edit == "swap" and j - i >= 2:
            text = text[:i] + text[j - 1] + text[i + 1:j - 1] + text[i] + text[j:]
        else:
            text = text[:i] + rng.choice(tokens) + text[j:]
    return text


def _spaced(rng: random.Random, text: str) -> str:
    """``text`` with whitespace added after some of its characters."""
    return "".join(c + (rng.choice((" ", "\t", "\n", "  ")) if rng.random() < 0.2 else "") for c in text)


def _huge_texts(n: int) -> list[tuple[str, str | None]]:
    """Python expressions of texts of about ``n`` bytes, each with the mesh text to read it on (None: it is a
    mesh text)."""
    k = n // 7
    return [
        (f"'device_ids=[' * {n // 12}", None),
        (f"'x=2,' * {n // 4}", None),
        (f"'x={k},device_ids=[' + ','.join(map(str, [*range({k} - 1), {k} - 2])) + ']'", None),
        (f"'x=2,device_ids=[' + ','.join(map(str, range({k}))) + ']'", None),
        (f"'[' * {n}", None),
        (f"'x' * {n} + '=2'", None),
        (f"'x=' + '0' * {n} + '2'", None),
        (f"'f32[' + '8{{x}},' * {n // 5} + '8]'", "x=2"),
        (f"'f32[8{{' + 'x,' * {n // 2} + 'y}}]'", "x=2,y=4"),
        (f"'f32[8] partial{{' + 'x,' * {n // 2} + '}}'", "x=2"),
        (f"'f32[8{{x:(' + '(' * {n} + '}}]'", "x=4"),
        (f"'f32' + '[' * {n // 2} + ']' * {n // 2}", "x=2"),
        (f"'f32[' + '{{' * {n} + ']'", "x=2"),
        (f"'f32[8{{x}}' + ' ' * {n} + ']'", "x=2"),
        (f"'f32[' + '1' * {n} + ']'", "x=2"),
        (f"'f32[8{{y:(1)' + '2' * {n} + '}}]'", "y=4"),
    ]


def probe(seed: int, quick: bool) -> Tally:
    tally = Tally("text")
    for i in range(3000 if quick else 20_000):
        rng = case_rng(seed, "text", i)
        draw = SeededDraw(rng)
        mesh = draw_mesh(draw, max_devices=16, min_devices=2, device_order=0.2)
        src, dst = draw_pair(draw, mesh, sub_axes=0.3, uneven=0.3, reductions=REDUCTIONS, reorder=0.1)
        kind = rng.choice(("mesh", "type", "mesh", "type", "random mesh", "random type"))
        tokens = MESH_TOKENS if "mesh" in kind else TYPE_TOKENS
        if kind.startswith("random"):
            text = "".join(rng.choice(tokens) for _ in range(rng.randint(0, 30)))
        else:
            text = str(rng.choice((mesh, dst.mesh) if kind == "mesh" else (src, dst)))
            text = mutated(rng, text, tokens) if rng.random() < 0.7 else _spaced(rng, text)
        _check(tally, repr(text), text, None if "mesh" in kind else str(mesh))
    for size in (10_000, 100_000) if quick else (10_000, 100_000, 1_000_000):
        for expr, mesh_text in _huge_texts(size):
            text = eval(expr)  # noqa: S307 - the expressions of _huge_texts
            seconds = _check(tally, expr, text, mesh_text)
            tally.peak(f"us of CPU per byte of a huge text (bound {1e6 * SECONDS_PER_BYTE:.0f})",
                       1e6 * seconds / len(text), expr)
    return tally


def _check(tally: Tally, expr: str, text: str, mesh_text: str | None) -> float:
    """Parse ``text`` (the value of the Python expression ``expr``; a mesh text, or a type on the mesh of
    ``mesh_text``) and tally the outcome; returns the CPU seconds it took."""
    mesh = None if mesh_text is None else Mesh.parse(mesh_text)
    call = f"Mesh.parse({expr})" if mesh is None else f"ShardingType.parse({expr}, Mesh.parse({mesh_text!r}))"
    parse = Mesh.parse if mesh is None else (lambda t: ShardingType.parse(t, mesh))
    t0 = time.process_time()
    failure = None
    try:
        value = parse(text)
    except ShardingError:
        outcome = "refused"
    except Exception as e:  # noqa: BLE001 - what the probe looks for
        outcome, failure = "other error", f"{call} {unexpected(e)}"
    else:
        outcome = "parsed"
        again = parse(str(value))
        if again != value:
            outcome, failure = "wrong", f"{call} is {value}, which parses back to {again}"
    seconds = time.process_time() - t0
    if failure is None and seconds > PARSE_ALLOWANCE_S + SECONDS_PER_BYTE * len(text):
        outcome, failure = "slow", f"{call} took {seconds:.2f} s of CPU for {len(text)} bytes"
    tally.add(outcome, failure)
    return seconds
