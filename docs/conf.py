"""Sphinx configuration: the Markdown pages of docs/ (MyST) and the API reference from the docstrings (autodoc).

``./dev docs`` builds it into docs/_build/html with every warning an error (``-W --keep-going -n``): a reference
that resolves to nothing fails the build. Two conventions of the project's docstrings are read here:

- An indented block after a paragraph is a code example (``    plan = redist.synthesize(src, dst)``), shown as
  a literal block (:func:`literal_examples`).
- A cross-reference may name any existing public name of redist or partir_core, documented here or not (the
  docstrings also serve readers of the source). One that names an object the reference documents under
  another name (``ShardingError`` in :mod:`redist.cost` is :class:`redist.ShardingError`) links there; one
  that names an undocumented internal module or object shows as code (:func:`resolve_internal`). A name that
  does not exist, or a private one (a leading underscore), stays a warning: a defect of the docstring.
"""

import importlib
import os
import re
import sys

from docutils import nodes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # document this checkout's redist and partir_core, whatever else is installed

import redist  # noqa: E402

project = "redist"
copyright = "the redist authors"
release = version = redist.__version__

extensions = ["myst_parser", "sphinx.ext.autodoc"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
myst_heading_anchors = 3

html_theme = "furo"
html_title = f"redist {release}"

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True, "undoc-members": True}  # __all__ is the public API, documented or not

nitpicky = True
# The build reaches no network, so no intersphinx: types of Python, numpy and JAX in signatures stay unlinked.
nitpick_ignore_regex = [(r"py:.*", r"(numpy|jax|collections|fractions|typing)\..*")]

OWN = ("redist", "partir_core")


def literal_examples(app, what, name, obj, options, lines):
    """Show an indented block that follows a paragraph as a literal block: the docstrings' examples."""
    for i in range(2, len(lines)):
        line, blank, before = lines[i], lines[i - 1], lines[i - 2]
        if not line.strip() or blank.strip() or not before.strip():
            continue
        if _indent(line) <= _indent(before) or before.rstrip().endswith("::"):
            continue
        if re.match(r"\s*([-*+] |\d+\.|\.\. |:\w)", before) or _in_list_item(lines, i - 2):
            continue
        lines[i - 2] = before.rstrip() + (":" if before.rstrip().endswith(":") else " ::")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _in_list_item(lines, i: int) -> bool:
    """Whether line ``i`` continues a list item (a block indented under a bullet is the item's, not code)."""
    for j in range(i, -1, -1):
        if not lines[j].strip():
            return False
        if re.match(r"\s*([-*+] |\d+\. )", lines[j]):
            return _indent(lines[i]) > _indent(lines[j])
    return False


def _lookup(dotted: str):
    """The object a dotted name denotes (a module, or an attribute path inside one), or None."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if attr in getattr(obj, "__dataclass_fields__", {}):  # a field without a default: no class attribute
                obj = obj.__dataclass_fields__[attr]
            elif hasattr(obj, attr):
                obj = getattr(obj, attr)
            else:
                return None
        return obj
    return None


def _contexts(node) -> list[str]:
    """Where a reference's target may be relative to: the class and module being documented, and the module
    that defines the docstring (a name re-exported by another module keeps its own module's references)."""
    module, cls = node.get("py:module"), node.get("py:class")
    out = [f"{module}.{cls}" if module and cls else None, module]
    source = re.search(r"docstring of ([\w.]+)", str(node.source or ""))
    if source:
        owner = source[1]
        out += [owner, owner.rsplit(".", 1)[0]]
        defined = getattr(_lookup(owner), "__module__", None)
        out.append(defined)
    return [c for c in out if c]


def resolve_internal(app, env, node, contnode):
    """Resolve a Python cross-reference that Sphinx did not: to the documented name of the same object, else
    to code when it names an existing public object of redist or partir_core."""
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"].lstrip("~.")
    if any(part.startswith("_") for part in target.split(".")):
        return None
    candidates = [target] + [f"{c}.{target}" for c in _contexts(node)]
    for name in candidates:
        obj = _lookup(name)
        if obj is None or not name.startswith(OWN):
            continue
        documented = _documented(env).get(id(obj))
        if documented is not None:
            return app.env.domains.python_domain.resolve_xref(
                env, node["refdoc"], app.builder, node["reftype"] if node["reftype"] != "data" else "obj",
                documented, node, contnode) or contnode
        return contnode
    return None


_DOCUMENTED: dict[int, dict[int, str]] = {}  # per count of documented objects; object ids live in this process only


def _documented(env) -> dict[int, str]:
    """``id(object) -> documented name`` for every object the API reference documents."""
    objects = env.domains.python_domain.objects
    if len(objects) not in _DOCUMENTED:
        table: dict[int, str] = {}
        for name in objects:
            obj = _lookup(name)
            if obj is not None and not isinstance(obj, (int, float, str, tuple, frozenset, type(None))):
                table.setdefault(id(obj), name)
        _DOCUMENTED[len(objects)] = table
    return _DOCUMENTED[len(objects)]


def setup(app):
    app.connect("autodoc-process-docstring", literal_examples)
    app.connect("missing-reference", resolve_internal)
