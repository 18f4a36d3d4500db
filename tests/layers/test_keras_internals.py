import keras
import numpy as np
import pytest

from keras_vit.layers.keras_internals import holds_memory, tensorflow_onednn_enabled, unallocated_build

BROKEN = f"Keras {keras.__version__} changed an internal that keras_vit.layers.keras_internals relies on: "


def test_the_keras_internals_of_unallocated_build_still_hold():
    # keras_internals is keras_vit's one user of Keras internals (its docstring names them). When this fails,
    # the installed Keras changed them: a scanned encoder would allocate its template block, or draw its
    # stacked weights from the wrong initializers.
    seeded = keras.initializers.RandomUniform(-1.0, 1.0, seed=7)
    layer = keras.layers.Dense(3, kernel_initializer=seeded)
    try:
        initializers = unallocated_build(layer, (None, 2))
        unallocated = lambda: [not holds_memory(v) for v in layer.weights]  # noqa: E731
        assert all(unallocated()), BROKEN + "a variable made in StatelessScope(initialize_variables=False) has a value"
    except (AttributeError, ImportError) as error:
        pytest.fail(BROKEN + repr(error))
    np.testing.assert_array_equal(np.asarray(initializers[0]((2, 3))), np.asarray(seeded((2, 3))),
                                  err_msg=BROKEN + "`variable._initializer` is not the initializer it was made with")
    with keras.StatelessScope():  # closing an initialising scope allocates every variable still waiting
        other = keras.Variable(initializer="ones", shape=(2,))
    assert all(unallocated()), BROKEN + "off the 'uninitialized_variables' list, a variable still gets a value"
    np.testing.assert_array_equal(other.numpy(), 1.0,
                                  err_msg=BROKEN + "other waiting variables are no longer initialised")


def test_holds_memory_tells_an_unallocated_variable_from_an_allocated_one():
    layer = keras.layers.Dense(3)
    unallocated_build(layer, (None, 2))
    allocated = keras.layers.Dense(3)
    allocated.build((None, 2))
    assert not any(holds_memory(v) for v in layer.weights)
    assert all(holds_memory(v) for v in allocated.weights)


def test_tensorflow_still_says_whether_its_onednn_kernels_are_on():
    import tensorflow as tf  # noqa: F401  (loaded, as when a first training step asks)

    assert isinstance(tensorflow_onednn_enabled(), bool), (
        "TensorFlow moved tensorflow.python.util._pywrap_util_port.IsMklEnabled: keras_vit._onednn cannot warn")
