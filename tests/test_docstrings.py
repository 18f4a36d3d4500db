"""The `Example:` sections of the docstrings run and print what they say."""

import doctest
import importlib
import pkgutil

import numpy as np
import pytest

import keras_vit

MODULES = sorted(
    name for _, name, _ in pkgutil.walk_packages(keras_vit.__path__, "keras_vit.")
)


@pytest.mark.parametrize("name", MODULES)
def test_examples(name):
    module = importlib.import_module(name)
    globs = {"np": np, "keras_vit": keras_vit, **vars(module)}
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    for test in finder.find(module, name, globs=globs):
        runner.run(test)
    assert runner.failures == 0, f"{runner.failures} docstring example(s) failed in {name}"


def test_named_builder_examples_are_collected():
    examples = doctest.DocTestFinder().find(keras_vit.ViT_H14, "ViT_H14", globs={"keras_vit": keras_vit})
    assert examples and "image_size=56" in examples[0].examples[0].source
