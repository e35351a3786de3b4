"""The examples of README.md and of the pages under docs/ as tests run them: each ```python and ```bash block carries
a marker on the line before it, `<!-- runs: GROUP -->` (a test runs it: `library` as it is, `serve` against a plain
`adafuse serve`, `app` against the app) or `<!-- not run: why -->`, and what its comments quote is checked against
what it prints:

- python: a line `print(...)  # "text" ...` — what that line prints (all its calls, as printed) starts with the
  string literal that begins the comment;
- bash: the comment lines under a command — every `"key": value` pair in them (a JSON string, number, list, null,
  true or false) is found in the JSON the command printed (numbers to the digits shown).
"""
from __future__ import annotations

import ast
import contextlib
import io
import json
import re
import shlex
import subprocess
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MARK = re.compile(r"<!-- (runs: (?P<group>[\w-]+)|not run: (?P<why>.+?)) -->")
PAIR = re.compile(r'"(?P<key>[\w.]+)": (?P<value>"(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?|\[[^\]]*\]|null|true|false)')


def pages() -> list[Path]:
    """README.md, then every page under docs/ (what a block's location is relative to: the repository root)."""
    return [README, *sorted((ROOT / "docs").glob("*.md"))]


@dataclass
class Example:
    line: int            # the line of the opening fence in its page
    lang: str            # "python" or "bash"
    code: str
    group: str | None    # None: not run
    why: str = ""
    where: str = "README.md"   # the page, relative to the repository root (docs/server.md, ...)

    def __str__(self) -> str:
        return f"{self.where}:{self.line} ({self.lang})"


def examples(text: str | None = None, where: str = "README.md") -> list[Example]:
    """Every python and bash block with its marker, in README.md and every page under docs/ (or in `text`, read as
    the page `where`); a block without one is an error naming its page and line."""
    if text is None:
        return [e for page in pages()
                for e in examples(page.read_text(encoding="utf-8"), page.relative_to(ROOT).as_posix())]
    lines = text.splitlines()
    out, i = [], 0
    while i < len(lines):
        fence = re.fullmatch(r"```(\w*)", lines[i])
        if not fence:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j] == "```")
        if fence.group(1) in ("python", "bash"):
            mark = MARK.fullmatch(lines[i - 1].strip()) if i else None
            if mark is None:
                raise AssertionError(f"{where}:{i + 1}: a {fence.group(1)} block needs `<!-- runs: GROUP -->` or "
                                     "`<!-- not run: why -->` on the line before it")
            out.append(Example(i + 1, fence.group(1), "\n".join(lines[i + 1:end]) + "\n", mark.group("group"),
                               mark.group("why") or "", where))
        i = end + 1
    return out


# ---- python ----

def _claims(code: str) -> dict[int, str]:
    """Line number → the string literal a `print(...)  # "..."` line's comment starts with."""
    out = {}
    for tok in tokenize.generate_tokens(io.StringIO(code).readline):
        if tok.type != tokenize.COMMENT or "print(" not in tok.line:
            continue
        body = tok.string[1:].strip()
        try:
            first = next(t for t in tokenize.generate_tokens(io.StringIO(body).readline))
        except (tokenize.TokenError, StopIteration):
            continue
        if first.type == tokenize.STRING:
            out[tok.start[0]] = ast.literal_eval(first.string)
    return out


def run_python(ex: Example, replace: dict[str, str] | None = None) -> dict[int, str]:
    """Execute the block (its text with `replace` applied); returns what each line printed, and checks the claims."""
    code = ex.code
    for a, b in (replace or {}).items():
        code = code.replace(a, b)
    printed: dict[int, str] = {}

    def capture(*args, sep=" ", end="\n", **_):
        line = sys._getframe(1).f_lineno
        printed[line] = printed.get(line, "") + sep.join(str(a) for a in args) + end
    exec(compile(code, str(ex), "exec"), {"__name__": "__readme__", "print": capture})
    for line, claim in _claims(code).items():
        got = printed.get(line)
        assert got is not None, f"{ex}, line {line}: nothing printed, the comment claims {claim!r}"
        assert got.startswith(claim), f"{ex}, line {line}: printed {got!r}, the comment claims {claim!r}"
    return printed


# ---- bash ----

def _complete(command: str) -> bool:
    try:
        shlex.split(command, comments=True)
    except ValueError:  # a quote still open: the command goes on on the next line
        return False
    return not command.endswith("\\")


def commands(ex: Example) -> list[tuple[str, list[str]]]:
    """(command, the comment lines under it) for each command of a bash block (continued lines joined)."""
    out: list[tuple[str, list[str]]] = []
    pending = ""
    for raw in ex.code.splitlines():
        line = raw.strip()
        if pending:
            pending = (pending[:-1].rstrip() + " " if pending.endswith("\\") else pending + "\n") + line
        elif line.startswith("#"):
            if out:
                out[-1][1].append(line[1:].strip())
            continue
        elif line:
            pending = line
        if pending and _complete(pending):
            out.append((pending, []))
            pending = ""
    return out


def _find(data, key: str, want) -> bool:
    """`key` with value `want` anywhere in `data` (numbers to the digits `want` shows)."""
    if isinstance(data, dict):
        return any((k == key and _same(v, want)) or _find(v, key, want) for k, v in data.items())
    if isinstance(data, list):
        return any(_find(v, key, want) for v in data)
    return False


def _same(got, want) -> bool:
    if isinstance(want, dict):
        return isinstance(got, dict) and got.keys() == want.keys() and all(_same(got[k], w) for k, w in want.items())
    if isinstance(want, list):
        return isinstance(got, list) and len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want))
    if isinstance(want, float) and isinstance(got, (int, float)):
        digits = len(repr(want).split(".")[1])
        return abs(got - want) <= 0.5 * 10 ** -digits + 1e-12
    return got == want


def check_bash_claims(ex: Example, command: str, output: str, claims: list[str]) -> None:
    pairs = [m for c in claims for m in PAIR.finditer(c)]
    if not pairs:
        return
    data = json.loads(output)
    for m in pairs:
        want = json.loads(m.group("value"))
        assert _find(data, m.group("key"), want), \
            f"{ex}: `{command[:60]}...` printed no \"{m.group('key')}\": {m.group('value')} (printed: {output[:600]})"


def run_bash(ex: Example, replace: dict[str, str] | None = None, timeout: float = 600) -> list[str]:
    """Run each command (`python` is this interpreter; `replace` applied to the command), check it exits 0 and its
    claims; returns the outputs."""
    outs = []
    for command, claims in commands(ex):
        for a, b in (replace or {}).items():
            command = command.replace(a, b)
        argv = shlex.split(command, comments=True)
        if argv[:3] == ["python", "-m", "adafuse"]:
            code, stdout, stderr = _adafuse(argv[3:])
        else:
            done = subprocess.run([sys.executable if argv[0] == "python" else argv[0], *argv[1:]], capture_output=True,
                                  text=True, timeout=timeout)
            code, stdout, stderr = done.returncode, done.stdout, done.stderr
        assert code == 0, f"{ex}: `{command}` exited {code}:\n{stderr[-2000:]}"
        check_bash_claims(ex, command, stdout, claims)
        outs.append(stdout)
    return outs


def _adafuse(args: list[str]) -> tuple[int, str, str]:
    """`python -m adafuse ARGS` as its entry point runs it (`adafuse.cli.main`), in this process: no new interpreter
    importing torch and transformers again (the command loads the models it names into a registry of its own, as it
    does on the command line; tests/test_cli.py starts the entry point as a process of its own). Returns (exit status,
    stdout, stderr)."""
    from adafuse.cli import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(args)
        except SystemExit as exc:  # --help, argparse's errors
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    return code or 0, out.getvalue(), err.getvalue()
