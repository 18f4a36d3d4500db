"""The house's layout rules, read off the source: which package imports which, where framework internals live."""

import ast
import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).parents[1]
PACKAGES = ("keras_vit", "trainers", "export")
# The only modules that use Keras or TensorFlow internals (BUILD.md), each with a test that fails when its
# assumption breaks: tests/layers/test_keras_internals.py, tests/trainers/test_keras_workarounds.py,
# tests/export/test_capi.py.
INTERNALS_MODULES = {"keras_vit/layers/keras_internals.py", "trainers/keras_workarounds.py", "export/capi.py"}
INTERNALS = re.compile(r"keras.src|tensorflow.python|tensorflow.lite.python|_flatten_layers|\bctypes\b")


def sources(package):
    return sorted((ROOT / package).rglob("*.py"))


def imported_modules(path):
    """Every module `path` imports, at its top or inside a function."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            yield node.module


@pytest.mark.parametrize("package, forbidden", [("trainers", "export"), ("export", "trainers"),
                                                ("keras_vit", "trainers"), ("keras_vit", "export")])
def test_imports_run_one_way_and_trainers_and_export_are_siblings(package, forbidden):
    found = {f"{path.relative_to(ROOT)}: {module}" for path in sources(package) for module in imported_modules(path)
             if module == forbidden or module.startswith(f"{forbidden}.")}
    assert not found, f"{package} must not import {forbidden}"


def test_framework_internals_live_in_at_most_three_modules():
    users = {str(path.relative_to(ROOT)) for package in PACKAGES for path in sources(package)
             if INTERNALS.search(path.read_text())}
    assert users <= INTERNALS_MODULES and len(INTERNALS_MODULES) <= 3, sorted(users - INTERNALS_MODULES)


def private_calls(path):
    """`obj._name(...)` calls in `path` on anything but `self`, `cls` or `super()`."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        name, owner = node.func.attr, node.func.value
        if not name.startswith("_") or name.startswith("__"):
            continue
        if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
            continue
        if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
            continue
        yield f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node.func)}"


def test_no_module_calls_another_s_private_functions():
    found = [call for package in PACKAGES for path in sources(package)
             if str(path.relative_to(ROOT)) not in INTERNALS_MODULES for call in private_calls(path)]
    assert not found


# Install advice and commands that send a user elsewhere: pip normalises `keras_vit[hub]` to `keras-vit`, an unrelated
# abandoned PyPI package that then shadows this one (the distribution is `keras-vision-transformer`), and
# huggingface_hub no longer ships `huggingface-cli` (its command is `hf`).
MISLEADING = re.compile(r"keras_vit\[|huggingface-cli|pip install\s+(?:-\S+\s+)*['\"]?keras[-_]vit(?![\w-])")


def test_no_tracked_file_advises_another_package_or_a_removed_command():
    listed = subprocess.run(["git", "ls-files", "-z", "--", "*.py", "*.md"], cwd=ROOT, capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout: {listed.stderr.strip()}")
    this = pathlib.Path(__file__).resolve()
    found = [f"{name}:{number}: {line.strip()}" for name in listed.stdout.split("\0")
             if name and (ROOT / name).is_file() and (ROOT / name).resolve() != this
             for number, line in enumerate((ROOT / name).read_text(errors="replace").splitlines(), 1)
             if MISLEADING.search(line)]
    assert not found, "advise pip install 'keras-vision-transformer[EXTRA]' (in a checkout pip install -e " \
                      "'.[EXTRA]') and `hf download`:\n" + "\n".join(found)
