"""`ruff check` passes on the whole repository, with the rules of pyproject.toml."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def ruff(*args):
    """`ruff ARGS` run by the ruff installed beside this Python (the `test` extra)."""
    # --no-cache: the test leaves no .ruff_cache behind in the checkout.
    return subprocess.run([sys.executable, "-m", "ruff", *args, "--no-cache"], cwd=ROOT, capture_output=True,
                          text=True)


def test_ruff_is_installed():
    result = ruff("--version")
    assert result.returncode == 0, f"ruff is missing: pip install -e '.[test]'\n{result.stderr}"


def test_the_repository_passes_ruff_check():
    result = ruff("check", "--output-format=concise", ".")
    assert result.returncode == 0, (f"ruff check found violations (fix them, or `ruff check --fix .`):\n"
                                    f"{result.stdout}{result.stderr}")


def test_ruff_reads_the_repository_rules():
    # A 121-column line is refused and a 120-column one passes: the configuration in pyproject.toml is
    # the one in force, not ruff's defaults (88 columns, E and F only). The probe goes in on stdin, named as
    # a file of the repository, so ruff resolves the repository's configuration for it and nothing is written.
    probe = f"X = '{'a' * 114}'\nY = '{'b' * 115}'\n\nfor i in range(3):\n    pass\n"
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format=concise",
                             "--stdin-filename", "tests/lint_probe.py", "-"], cwd=ROOT, input=probe,
                            capture_output=True, text=True)
    found = result.stdout
    assert ":2:" in found and "E501" in found and ":1:" not in found, found
    assert "B007" in found, found  # flake8-bugbear is on: the unused loop variable `i`
