"""The package's shape: no import circles, files a newcomer can read, no findings or model names in the library."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import adafuse

pytestmark = pytest.mark.unit
PACKAGE = Path(adafuse.__file__).resolve().parent


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = ["adafuse", *path.relative_to(PACKAGE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The adafuse modules `name` imports anywhere in its file: function-level imports count, and so do imports for
    type checkers only (under `if TYPE_CHECKING:`): they do not run, but a reader still follows a circle."""
    is_pkg = path.name == "__init__.py"
    found = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name and t.startswith("adafuse"):
                found.add(t)
    return found


def test_the_import_structure_has_no_circles():
    mods = _modules()
    graph = {n: _imports(n, p, set(mods)) for n, p in mods.items()}
    # importing a submodule runs its packages' __init__ first: an edge to a package's own parent is not a circle
    graph = {n: {t for t in deps if not n.startswith(t + ".")} for n, deps in graph.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> None:
        state[n] = 1
        stack.append(n)
        for t in sorted(graph[n]):
            if state.get(t) == 1:
                raise AssertionError("import circle: " + " -> ".join(stack[stack.index(t):] + [t]))
            if t not in state:
                visit(t)
        stack.pop()
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n)


SIZED = (PACKAGE, PACKAGE.parent / "app")  # the library and the app: no module over 450 lines, no function over 80


def sized_files():
    return [p for root in SIZED for p in sorted(root.rglob("*.py"))]


def test_no_module_of_the_library_or_the_app_is_over_450_lines():
    long = {str(p.relative_to(PACKAGE.parent)): n for p in sized_files()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 450}
    assert not long, f"split these by concept: {long}"


def test_no_function_of_the_library_or_the_app_is_over_80_lines():
    import ast
    long = {}
    for p in sized_files():
        for f in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.end_lineno - f.lineno >= 80:
                long[f"{p.relative_to(PACKAGE.parent)}::{f.name}"] = f.end_lineno - f.lineno + 1
    assert not long, f"split these into small parts: {long}"


def test_the_layout_doc_names_every_module_of_the_library():
    """docs/layout.md is where a newcomer finds a module: each file of the package is named there (a module added
    without a word in it, or one it names that is gone, is how the doc drifts from the code)."""
    layout = (PACKAGE.parent / "docs" / "layout.md").read_text(encoding="utf-8")
    unnamed = [str(p.relative_to(PACKAGE)) for p in sorted(PACKAGE.rglob("*.py"))
               if p.name != "__init__.py" and f"`{p.name}`" not in layout]
    assert not unnamed, f"say what these are in docs/layout.md: {unnamed}"
    named = set(re.findall(r"`(\w+\.py)`", layout))
    here = {p.name for p in PACKAGE.parent.glob("*/**/*.py")} | {p.name for p in PACKAGE.parent.glob("*.py")}
    assert named <= here, f"docs/layout.md names files that are gone: {sorted(named - here)}"


# Model names (the embedded pair, the paper's members), issue numbers, targets and verdicts belong to the catalog
# file, the README, docs/ and experiments/, never to the library's code.
FORBIDDEN = [
    (r"SmolLM|smollm|Gemma|gemma|Qwen|qwen3|Llama-3|llama-3|Mistral-7B|mistral-7b|Mistral-7B-Instruct", "a model name"),
    (r"[Ii]ssues? *#?\d+|\(#\d+\)", "an issue number"),
    (r"[Tt]arget (met|missed)|headline|is reproduced|\bverdict", "a finding"),
]


def test_the_library_holds_no_model_names_issue_numbers_or_findings():
    hits = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for pattern, what in FORBIDDEN:
                if re.search(pattern, line):
                    hits.append(f"{path.relative_to(PACKAGE)}:{i}: {what}: {line.strip()[:100]}")
    assert not hits, "\n".join(hits)


def test_the_check_itself_finds_what_it_looks_for():
    """The patterns above are not vacuous: each catches a line it must catch."""
    lines = ["DEFAULT = ('smollm2-135m-instruct', 'gemma3-270m')", "# see issue 15", "print('Target met')"]
    for (pattern, _), line in zip(FORBIDDEN, lines):
        assert re.search(pattern, line)


def test_the_import_reader_follows_type_checking_and_function_level_imports(tmp_path):
    """A module that imports another only for type checkers, or inside a function, depends on it all the same."""
    src = tmp_path / "m.py"
    src.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .config import DecodeConfig\n"
                   "def f():\n    from .trace import Trace\n", encoding="utf-8")
    assert _imports("adafuse.m", src, {"adafuse.config", "adafuse.trace"}) == {"adafuse.config", "adafuse.trace"}


SPY = r'''
import os, sys, importlib, pkgutil
roots = tuple(sys.argv[1:])
reads = []
class Spy(type(os.environ)):
    def __getitem__(self, key):
        frame = sys._getframe(1)
        while frame.f_code.co_filename.endswith(("os.py", "<frozen os>", "_collections_abc.py", "_collections_abc>")):
            frame = frame.f_back
        caller = frame.f_code.co_filename
        if caller.startswith(roots):
            reads.append((key, caller))
        return super().__getitem__(key)
spy = Spy(os.environ._data, os.environ.encodekey, os.environ.decodekey, os.environ.encodevalue,
          os.environ.decodevalue)
os.environ = spy
import adafuse
for m in pkgutil.walk_packages(adafuse.__path__, "adafuse."):
    if not m.name.endswith("__main__"):
        importlib.import_module(m.name)
for name in ("app.controller", "app.api", "app.ui"):
    importlib.import_module(name)
print(sorted(set(reads)))
'''


def test_no_module_reads_the_environment_at_import():
    """Importing every module of the library and the app reads no environment variable (data folders, the vLLM
    environment and the app's decoding slots are found when asked): the spy on os.environ sees every read made by a
    file under adafuse/ or app/ while they import."""
    import subprocess
    import sys
    root = PACKAGE.parent
    out = subprocess.run([sys.executable, "-c", SPY, str(PACKAGE), str(root / "app")], cwd=root, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_a_decode_holds_its_policies_in_a_few_parts():
    """`Decoding.__init__` sets at most 10 attributes: the loop and its lifecycle, each policy an object of its own
    (speculation, catch-ups, fusion, settings changed mid-decode, the models at work)."""
    tree = ast.parse((PACKAGE / "decoder.py").read_text(encoding="utf-8"))
    init = next(f for c in tree.body if isinstance(c, ast.ClassDef) and c.name == "Decoding"
                for f in c.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
    set_ = {t.attr for n in ast.walk(init) if isinstance(n, (ast.Assign, ast.AnnAssign))
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
            if isinstance(t, ast.Attribute) and getattr(t.value, "id", None) == "self"}
    assert len(set_) <= 10, sorted(set_)
