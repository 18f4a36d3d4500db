"""README.md stays a front page and BUILD.md a decision log: their size limits (issue 39)."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
README_LINES, BUILD_LINES, CELL_WORDS = 150, 450, 40


def lines(path):
    return len(path.read_text().splitlines())


def table_cells(text):
    """[(line number, cell text)] of every cell of every Markdown table (rows start with `|`) outside code."""
    cells, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if fenced or not line.lstrip().startswith("|"):
            continue
        # `\|` is a pipe inside a cell, not a border.
        row = re.split(r"(?<!\\)\|", line.strip().strip("|"))
        cells += [(number, cell.strip()) for cell in row]
    return cells


def long_cells(text, limit=CELL_WORDS):
    return [(number, len(cell.split())) for number, cell in table_cells(text) if len(cell.split()) > limit]


def test_readme_is_a_front_page():
    readme = ROOT / "README.md"
    assert lines(readme) <= README_LINES, f"README.md has {lines(readme)} lines, at most {README_LINES}"
    too_long = long_cells(readme.read_text())
    assert not too_long, "README.md table cells over 40 words (line, words): " + ", ".join(map(str, too_long))


def test_build_md_is_a_decision_log():
    build = ROOT / "BUILD.md"
    assert lines(build) <= BUILD_LINES, f"BUILD.md has {lines(build)} lines, at most {BUILD_LINES}"
    # Entries are standing decisions grouped by topic; a dated heading is a diary entry.
    dated = [line for line in build.read_text().splitlines()
             if line.startswith("#") and re.search(r"\b\d{4}-\d{2}-\d{2}\b", line)]
    assert not dated, f"BUILD.md headings with dates: {dated}"


@pytest.mark.parametrize("text, expected", [
    ("| a | b |\n|---|---|\n| " + "word " * 41 + "| short |\n", [(3, 41)]),
    ("| " + "word " * 40 + "|\n", []),
    ("| `a \\| b` " + "w " * 39 + "|\n", [(1, 42)]),  # an escaped pipe does not split its cell
    ("```\n| " + "word " * 50 + "|\n```\n", []),  # a table in a code block is code
])
def test_long_cells_are_counted(text, expected):
    assert long_cells(text) == expected


def test_every_test_build_md_cites_exists():
    text = (ROOT / "BUILD.md").read_text()
    cited = re.findall(r"(tests/[\w/]+\.py)(?:::(\w+))?", text)
    assert cited
    missing = [f"{path}::{name}" if name else path for path, name in cited
               if not (ROOT / path).is_file() or (name and not re.search(
                   rf"^def {name}\(|^class {name}\b", (ROOT / path).read_text(), re.M))]
    assert not missing, f"BUILD.md cites tests that do not exist: {missing}"
