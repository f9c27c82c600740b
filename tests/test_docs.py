"""Every shell and Python block of README.md and docs/*.md runs, so a documented command cannot rot.

The README's blocks run first, in one temporary folder (they save `model.pt` and `model.j2t`, which the pages use);
then each page's blocks run in order in that folder: shell blocks with bash (`set -e`, so any failing command fails
the block), Python blocks in one namespace per page, as a reader pasting them in order would. A block that needs a
GPU, a server or a long time is marked by an HTML comment on the line before it,
`<!-- docs-test: skip (the reason) -->`, and counted: the skips are listed, and a page may not skip every block.
"""
from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted((ROOT / "docs").glob("*.md"))
RUN_LANGUAGES = {"bash": "shell", "sh": "shell", "shell": "shell", "python": "python"}
SKIP = re.compile(r"<!--\s*docs-test:\s*skip\s*\((.+?)\)\s*-->")
BLOCK_TIMEOUT_S = 120


@dataclass
class Block:
    page: str
    line: int  # where the block's fence opens, 1-based
    kind: str  # "shell" or "python"
    code: str
    skip: str = ""  # the reason, where marked

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def blocks_of(path: Path) -> list[Block]:
    """The shell and Python blocks of a Markdown page, with the skip mark of the line before each."""
    lines = path.read_text().split("\n")
    found, i = [], 0
    while i < len(lines):
        opening = re.match(r"^```(\w*)\s*$", lines[i])
        if not opening:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        kind = RUN_LANGUAGES.get(opening.group(1))
        if kind:
            mark = SKIP.search(lines[i - 1]) if i else None
            found.append(Block(path.name, i + 1, kind, "\n".join(lines[i + 1:end]) + "\n",
                               mark.group(1) if mark else ""))
        i = end + 1
    return found


def environment() -> dict:
    """The blocks' environment: the checkout importable from any folder (so `jit2triton` and `python -c` find it
    whether or not it is installed), one thread for the generated kernels' tests to stay cheap."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def run_shell(block: Block, folder: Path) -> None:
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block.code], cwd=folder, env=environment(),
                          capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
    if done.returncode != 0:
        pytest.fail(f"{block.where}: the shell block exited {done.returncode}\n{block.code}\n--- stdout\n"
                    f"{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}")


def run_python(block: Block, namespace: dict, folder: Path) -> None:
    # from a file of its own, so that torch.jit.script finds a class's source (inspect reads it from the file)
    source = folder / f"docs_{block.page.replace('.', '_').replace('-', '_')}_{block.line}.py"
    source.write_text(block.code)
    previous = os.getcwd()
    os.chdir(folder)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(block.code, str(source), "exec"), namespace)  # noqa: S102 - the documented code itself
    except Exception as err:  # noqa: BLE001 - named with the block
        pytest.fail(f"{block.where}: the Python block raised {type(err).__name__}: {err}\n{block.code}")
    finally:
        os.chdir(previous)


def run_page(blocks: list[Block], folder: Path) -> list[str]:
    """Run a page's blocks in order; -> the skipped ones, as 'where: reason'."""
    namespace: dict = {"__name__": "__docs__"}
    skipped = []
    for block in blocks:
        if block.skip:
            skipped.append(f"{block.where}: {block.skip}")
        elif block.kind == "shell":
            run_shell(block, folder)
        else:
            run_python(block, namespace, folder)
    return skipped


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The README's blocks, run once: the folder they leave (model.pt, model.j2t) is where every page runs."""
    where = tmp_path_factory.mktemp("docs")
    pytest.docs_readme_skips = run_page(blocks_of(ROOT / "README.md"), where)
    return where


def test_readme_blocks_run(folder):
    assert (folder / "model.pt").is_file() and (folder / "model.j2t").is_file()
    print(f"README.md: skipped {len(pytest.docs_readme_skips)}: {pytest.docs_readme_skips}")


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_page_blocks_run(page, folder):
    blocks = blocks_of(page)
    skipped = run_page(blocks, folder)
    print(f"{page.name}: ran {len(blocks) - len(skipped)} blocks, skipped {len(skipped)}: {skipped}")
    assert not blocks or len(skipped) < len(blocks) or page.name in ALL_SKIPPED_ALLOWED, (
        f"{page.name}: every block is skipped; make one runnable")


# pages whose every command needs a GPU, a C++ toolchain run or a long benchmark
ALL_SKIPPED_ALLOWED = {"benchmarks.md", "correctness.md", "serving.md"}


def test_readme_setup_is_what_ci_runs():
    """The README's two set-up commands are the ones `.ci/run` runs, so the documented install is the tested one."""
    setup = next(b for b in blocks_of(ROOT / "README.md") if "jit2triton demo" in b.code)
    commands = [line.split("#")[0].strip() for line in setup.code.splitlines() if line.split("#")[0].strip()]
    ci = (ROOT / ".ci" / "run").read_text()
    ci_commands = [line.split("#")[0].strip() for line in ci.splitlines()]
    for command in commands:
        # `pip install` in the README is `python -m pip install --quiet` in CI: the same install, quieter
        words = shlex.split(command.replace("pip install", "python -m pip install --quiet", 1)
                            if command.startswith("pip install") else command)
        assert any(shlex.split(line) == words for line in ci_commands if line), (
            f"README's `{command}` is not a command of .ci/run")


def test_skip_marks_are_read():
    """A skip mark applies to the block right after it, and only to a block: a stray mark would hide nothing."""
    for path in [ROOT / "README.md", *PAGES]:
        lines = path.read_text().split("\n")
        for i, line in enumerate(lines):
            if SKIP.search(line):
                assert i + 1 < len(lines) and re.match(r"^```(bash|sh|shell|python)\s*$", lines[i + 1]), (
                    f"{path.name}:{i + 1}: a docs-test skip mark not right before a shell or Python block")


def test_blocks_are_found():
    """The extraction itself: the README's example block is a Python block, its set-up block a skipped shell block."""
    readme = blocks_of(ROOT / "README.md")
    assert any(b.kind == "python" and "jit2triton.convert" in b.code and not b.skip for b in readme)
    assert any(b.kind == "shell" and b.skip and "pytest" in b.code for b in readme)


def test_relative_links_resolve():
    """Every relative link of the README and the pages names a file that exists, and an anchor a heading it has."""
    for path in [ROOT / "README.md", *PAGES]:
        for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
            if re.match(r"^[a-z]+://", target):
                continue
            file, _, anchor = target.partition("#")
            linked = (path.parent / file).resolve() if file else path
            assert linked.exists(), f"{path.name}: link to {target}, which does not exist"
            if anchor and linked.suffix == ".md":
                headings = {re.sub(r"[^\w\- ]", "", h.strip("# ").lower()).replace(" ", "-")
                            for h in linked.read_text().split("\n") if h.startswith("#")}
                assert anchor in headings, f"{path.name}: link to {target}: no such heading"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-s"]))
