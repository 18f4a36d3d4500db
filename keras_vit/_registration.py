"""Registers keras_vit's Keras classes as soon as Keras is imported, whether before or after keras_vit.

`keras.models.load_model` finds a saved layer only among the classes registered by
`keras.saving.register_keras_serializable`, which happens when their modules are imported. `import keras_vit`
imports none of them (so that `keras_vit.config` serves command lines before TensorFlow starts); this module
imports them the moment Keras itself is imported, so a process that imported keras_vit reads a keras_vit
`.keras` file as it did when the package imported everything at once.
"""

import importlib
import importlib.util
import sys

# The modules whose import registers every keras_vit class a `.keras` file can name.
SERIALIZABLE = ("keras_vit.layers", "keras_vit.model", "keras_vit.analysis", "keras_vit.optimizers",
                "keras_vit.fine_tuning")


def register():
    for name in SERIALIZABLE:
        importlib.import_module(name)


class _AfterKeras:
    """A `sys.meta_path` finder that leaves finding Keras to the others and registers once Keras has run."""

    def __init__(self):
        self.finding = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "keras" or self.finding:
            return None
        self.finding = True  # the lookup below passes through sys.meta_path, this finder included
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self.finding = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_register(module):
            exec_module(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            register()

        spec.loader.exec_module = exec_then_register  # this spec's own loader instance
        return spec


def register_with_keras():
    """Registers now if Keras is loaded, else when it is."""
    if sys.modules.get("keras") is not None:  # None: Keras is blocked, not loaded
        register()
    elif not any(isinstance(finder, _AfterKeras) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterKeras())
