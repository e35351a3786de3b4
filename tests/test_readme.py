"""The examples of README.md and docs/*.md run as written (tests/readme.py): the library's and the command line's on the
bundled pair, the server's against `adafuse serve` started as the README starts it (a free port instead of 8000/8931);
the app's runs in tests/test_app_e2e.py against the app on the bundled pair. Each checks what its comments quote. The
pages' relative links lead to files (and headings) that exist."""
from __future__ import annotations

import re

import httpx
import pytest

from tests.readme import README, ROOT, Example, commands, examples, pages, run_bash, run_python

GROUPS = {"library", "serve", "app"}  # the groups some test runs (this module, and test_app_e2e.py for "app")


def _group(name: str) -> list[Example]:
    found = [e for e in examples() if e.group == name]
    assert found, f"neither README.md nor a page under docs/ has an example marked `runs: {name}`"
    return found


@pytest.mark.unit
def test_every_example_says_whether_it_runs_and_a_test_runs_its_group():
    found = examples()
    assert len(found) >= 10
    assert {e.group for e in found if e.group} == GROUPS
    assert all(e.why for e in found if e.group is None)
    with pytest.raises(AssertionError, match="README.md:3: a python block needs"):
        examples("text\n\n```python\nprint(1)\n```\n")
    with pytest.raises(AssertionError, match="docs/x.md:3: a bash block needs"):
        examples("text\n\n```bash\nls\n```\n", "docs/x.md")
    assert {e.where for e in found} > {"README.md"}  # the pages under docs/ are read too
    first = next(e for e in found if e.group == "library")
    assert (first.where, first.lang) == ("README.md", "python")  # the README opens with the library example


@pytest.mark.unit
def test_the_readme_reads_in_five_minutes():
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 300, "move the detail to a page under docs/"


def _anchors(text: str) -> set[str]:
    """The anchors GitHub gives a page's headings (lower case, punctuation dropped, spaces to hyphens, -1, -2, ...
    for repeats); headings inside code blocks do not count."""
    out, seen, fence = set(), {}, False
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
        m = None if fence else re.match(r"#{1,6} (.+)", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _links(text: str) -> list[tuple[int, str]]:
    """(line, target) of every markdown link and image outside code blocks and code spans."""
    out, fence = [], False
    for i, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fence = not fence
            continue
        if not fence:
            out += [(i, m.group(1)) for m in re.finditer(r"\]\(([^)\s]+)\)", re.sub(r"`[^`]*`", "", line))]
    return out


@pytest.mark.unit
def test_every_relative_link_of_the_readme_and_the_docs_leads_somewhere():
    broken = []
    for page in pages():
        for line, target in _links(page.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target):
                continue  # http:, https:, mailto:
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(ROOT)}:{line}: {target}"
            if not dest.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest.read_text(encoding="utf-8")):
                broken.append(f"{where} (no such heading)")
    assert not broken, "\n".join(broken)
    assert _anchors("# A b (`c.py`, d's)\n```\n# not a heading\n```\n## A b (`c.py`, d's)\n") == \
        {"a-b-cpy-ds", "a-b-cpy-ds-1"}


@pytest.mark.unit
def test_the_runner_catches_a_claim_that_is_not_printed():
    good = Example(1, "python", 'x = " Paris"\nprint(x, 2)   # " Paris" and more\n', "t")
    assert run_python(good) == {2: " Paris 2\n"}
    with pytest.raises(AssertionError, match=r"printed ' London\\n', the comment claims ' Paris'"):
        run_python(Example(1, "python", 'print(" London")   # " Paris"\n', "t"))
    bash = Example(1, "bash", "echo '{\"a\": {\"text\": \" Paris.\", \"lp\": [-0.9981, -1.6]}}'\n"
                              "# \"text\": \" Paris.\", \"lp\": [-0.998, -1.6]\n", "t")
    assert commands(bash)[0][1] == ['"text": " Paris.", "lp": [-0.998, -1.6]']
    run_bash(bash)
    with pytest.raises(AssertionError, match='printed no "text": " Rome."'):
        run_bash(Example(1, "bash", "echo '{\"text\": \" Paris.\"}'\n# \"text\": \" Rome.\"\n", "t"))
    split = Example(1, "bash", "curl -s x -d '{\"a\": 1,\n  \"b\": 2}' \\\n  -H y\n", "t")
    assert commands(split) == [("curl -s x -d '{\"a\": 1,\n\"b\": 2}' -H y", [])]


@pytest.mark.models
def test_the_library_and_command_line_examples_print_what_they_claim(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # they write trace.json and t.json
    for ex in _group("library"):
        run_python(ex) if ex.lang == "python" else run_bash(ex)
    assert (tmp_path / "trace.json").exists() and (tmp_path / "t.json").exists()


@pytest.mark.models
def test_the_server_examples_print_what_they_claim(adafuse_server):
    """Against the session's `adafuse serve` (conftest.py), started as README starts it."""
    for ex in _group("serve"):
        replace = {"http://127.0.0.1:8931": adafuse_server[0]}
        run_python(ex, replace) if ex.lang == "python" else run_bash(ex, replace)


@pytest.mark.models
def test_the_servers_defaults_answer_as_the_library_and_the_app_do(adafuse_server, pair):
    """A first request with none of the ensemble's settings decodes as the library's defaults do (the app's page starts
    from the same: tests/test_defaults.py): per word, a bare question about Hamlet is answered (per token it ran into
    a list, " 1. 2. 3. …": docs/defaults.md), and with one worked example first too."""
    from adafuse import AdaFuse, DecodeConfig
    bare = "Question: Who wrote Hamlet?\nAnswer:"
    for prompt, first_line in ((bare, "Shakespeare"), ("Question: What is the capital of Italy?\nAnswer: Rome\n\n" + bare,
                                                    "Shakespeare")):
        r = httpx.post(f"{adafuse_server[0]}/v1/completions", timeout=300,
                       json={"model": "adafuse", "prompt": prompt, "max_tokens": 12})
        assert r.status_code == 200, r.text
        text = r.json()["choices"][0]["text"]
        assert text == AdaFuse(pair, DecodeConfig(max_new_tokens=12)).generate(prompt).output
        assert first_line in text.split("\n")[0], text
