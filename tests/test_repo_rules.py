"""Rules about the repository itself that the linter cannot check."""

from __future__ import annotations

import ast
import multiprocessing
import os
import re
import subprocess
from pathlib import Path
from typing import Optional

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(p for folder in ("commtag", "tests", "launch") for p in (ROOT / folder).rglob("*.py"))

#: A noqa with its codes and nothing after them; the reason goes after " - ".
_BARE_NOQA = re.compile(r"#\s*noqa(?::\s*[A-Z]+[0-9]+(?:\s*,\s*[A-Z]+[0-9]+)*)?\s*$")


def test_every_noqa_says_why():
    bare = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
            for path in SOURCES
            for number, line in enumerate(path.read_text().splitlines(), 1)
            if _BARE_NOQA.search(line)]
    assert not bare, "a noqa without its reason (write `# noqa: CODE - why`):\n" + "\n".join(bare)


def test_a_test_not_marked_slow_cannot_start_a_process():
    """conftest's guard: the fast subset (launch/test.sh --fast) stays free of processes."""
    from conftest import processes_refused

    with processes_refused("this test"):
        with pytest.raises(RuntimeError, match="this test starts a process but is not marked slow"):
            subprocess.run(["true"], check=True, timeout=10)
        with pytest.raises(RuntimeError, match="not marked slow"):
            multiprocessing.get_context("spawn").Process(target=print).start()


def test_hypothesis_is_derandomized_exactly_in_ci():
    """CI (.ci/run) selects the derandomized profile; elsewhere examples are random."""
    assert "COMMTAG_HYPOTHESIS_PROFILE=ci" in (ROOT / ".ci" / "run").read_text()
    assert settings().derandomize is (os.environ.get("COMMTAG_HYPOTHESIS_PROFILE") == "ci")


def test_launch_scripts_import_without_editing_sys_path():
    """launch/ imports its helpers from commtag.testing (installed, or the checkout under ``python -m``)."""
    edits = [f"{path.relative_to(ROOT)}:{number}" for path in sorted((ROOT / "launch").glob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1) if "sys.path" in line]
    assert edits == []


#: Most commits docs/benchmarks.md may name: its figures are the current ones, history is git log.
MAX_BENCHMARK_COMMITS = 30
#: An abbreviated commit hash as the docs write one: 7 to 12 hex digits, letters and digits both.
_COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,12}\b")
#: A reference to an issue of the project's tracker: "issue", a hash and its number; a hash, a
#: number and "item"; or a hash and a number in parentheses.
_ISSUE = re.compile(r"\bissues?\s*#\s*[0-9]+|#[0-9]+\s+item\b|\(#[0-9]+\b", re.IGNORECASE)
#: The project's own text: sources, docs and scripts (third-party trace data is not its prose).
_TEXT_SUFFIXES = {".py", ".md", ".sh", ".toml", ".txt", ".cfg", ".ini", ".yaml", ".yml"}


def test_the_benchmarks_page_names_at_most_30_commits():
    """The page keeps each benchmark's current figures, each table with its commit."""
    commits = set(_COMMIT.findall((ROOT / "docs" / "benchmarks.md").read_text()))
    assert len(commits) <= MAX_BENCHMARK_COMMITS, sorted(commits)


def test_no_source_doc_or_script_names_an_issue():
    """Docs, docstrings and comments say what the code does and what a test checks, not which issue
    asked for it."""
    texts = [ROOT / "README.md"] + [path for folder in ("commtag", "tests", "launch", "docs")
                                    for path in sorted((ROOT / folder).rglob("*"))
                                    if path.suffix in _TEXT_SUFFIXES and path.is_file()]
    named = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
             for path in texts
             for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
             if _ISSUE.search(line)]
    assert not named, "name what the code does, not the issue:\n" + "\n".join(named)


PACKAGE = ROOT / "commtag"
#: Most modules a folder of the package may hold (``__init__.py`` counted).
MAX_MODULES_PER_FOLDER = 12
#: Most lines a module may have.
MAX_MODULE_LINES = 450


def _modules() -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its folder's)."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Which of ``modules`` each imports: every import statement, at the top, inside a function or
    under TYPE_CHECKING; ``from package import name`` imports the submodule ``name`` if there is one,
    else the package."""
    graph: dict[str, set[str]] = {name: set() for name in modules}

    def nearest(name: str) -> Optional[str]:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
            else:
                continue
            for target in targets:
                found = nearest(target)
                if found is not None and found != name:
                    graph[name].add(found)
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def test_the_package_has_no_import_cycle():
    """Deferred imports and TYPE_CHECKING imports count: a cycle they hold open is still one."""
    cycles = import_cycles(import_graph(_modules()))
    assert cycles == [], "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_finder_sees_a_cycle_through_a_deferred_import(tmp_path: Path):
    """The rule above would pass on a finder that saw nothing: here one inside a function and one
    under TYPE_CHECKING close a cycle, and a plain chain is none."""
    for name, text in {"a.py": "def f():\n    from pkg import b\n",
                       "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import f\n",
                       "c.py": "import pkg.a\n", "__init__.py": ""}.items():
        (tmp_path / "pkg").mkdir(exist_ok=True)
        (tmp_path / "pkg" / name).write_text(text)
    modules = {"pkg": tmp_path / "pkg" / "__init__.py",
               **{f"pkg.{m}": tmp_path / "pkg" / f"{m}.py" for m in "abc"}}
    assert import_cycles(import_graph(modules)) == [["pkg.a", "pkg.b"]]


def test_no_folder_holds_more_than_twelve_modules():
    counts = {str(folder.relative_to(ROOT)): len(list(folder.glob("*.py")))
              for folder in {p.parent for p in PACKAGE.rglob("*.py")}}
    over = {folder: n for folder, n in counts.items() if n > MAX_MODULES_PER_FOLDER}
    assert over == {}, f"folders over {MAX_MODULES_PER_FOLDER} modules: {over}"


def test_no_module_is_over_450_lines():
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    grown = {path: n for path, n in sizes.items() if n > MAX_MODULE_LINES}
    assert grown == {}, f"modules over {MAX_MODULE_LINES} lines: {grown}"


def test_every_error_commtag_defines_derives_from_commtag_error():
    """One root (commtag.errors.CommtagError) for every error raised on purpose; a SIGTERM stopping
    a merge (a KeyboardInterrupt) is not an error."""
    import importlib

    from commtag.errors import CommtagError

    defined = []
    for name in sorted(_modules()):
        if name.endswith("__main__"):
            continue
        module = importlib.import_module(name)
        defined += [value for value in vars(module).values() if isinstance(value, type)
                    and value.__module__ == name and issubclass(value, BaseException)]
    strays = [f"{e.__module__}.{e.__qualname__}" for e in defined
              if not issubclass(e, (CommtagError, KeyboardInterrupt))]
    assert len(defined) >= 9 and strays == []


#: What points outside the repository: the folder beside a checkout that once held test data
#: and notes, and the variable that pointed there. A fresh clone has neither.
#: Built from parts, so that this file, which names them, is no match of its own scan.
_OUTSIDE = re.compile("|".join([r"\.\./" + "shared", "shared/" + "reference", "shared/" + "data",
                                "COMMTAG_" + "PUBLIC_TRACES"]))
#: Largest tracked file, bytes: test data stays small enough to clone and review.
MAX_TRACKED_BYTES = 5 << 20


def _tracked_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60)
    return [ROOT / name for name in listed.stdout.decode().split("\0") if name]


@pytest.mark.slow  # asks git which files are tracked
def test_the_repository_stands_alone():
    """No tracked file (this one aside) cites or reads anything beside the checkout, and none is over 5 MB."""
    this = Path(__file__).resolve()
    files = _tracked_files()
    pointing = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
                for path in files if path.resolve() != this and path.is_file()
                and b"\0" not in (head := path.read_bytes()[:8192]) and not head.startswith(b"\x1f\x8b")
                for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
                if _OUTSIDE.search(line)]
    assert pointing == [], "references outside the repository:\n" + "\n".join(pointing)
    large = {str(path.relative_to(ROOT)): path.stat().st_size for path in files
             if path.is_file() and path.stat().st_size > MAX_TRACKED_BYTES}
    assert len(files) > 100 and large == {}, f"tracked files over {MAX_TRACKED_BYTES} bytes: {large}"


#: Most lines the README may have: it is for users; design, benchmarks and compatibility live in docs/.
MAX_README_LINES = 400


def test_the_readme_stays_a_users_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines; move detail into docs/"
