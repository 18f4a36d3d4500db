"""The one place keras_vit's library relies on framework internals: a layer built without memory, and whether
TensorFlow runs its oneDNN kernels.

`ScannedEncoder` runs `EncoderBlock`'s own math on slices of its stacked
weights through the block's public `stateless_call`, so it needs a built
block whose variables only name those slices and whose initializers draw the
stacked weights. Keras offers no public way to keep a variable unallocated
nor to read its initializer; `unallocated_build` does both with the internals
below (keras/src/backend/common/variables.py and global_state.py). TensorFlow
says whether its oneDNN kernels are on only through `_pywrap_util_port`
(`tensorflow_onednn_enabled`, for `keras_vit._onednn`'s warning). Both are
checked on the installed frameworks by tests/layers/test_keras_internals.py.
"""

import keras


def unallocated_build(layer, input_shape):
    """Builds `layer` with variables that hold no memory; returns its trainable variables' initializers.

    Relies on:
    - a variable made in `keras.StatelessScope(initialize_variables=False)`
      has no value, keeps its initializer in `variable._initializer`, and
      waits in the global list "uninitialized_variables" until an
      initialising scope closes;
    - taken off that list, it stays without a value.
    """
    from keras.src.backend.common import global_state

    with keras.StatelessScope(initialize_variables=False):
        layer.build(input_shape)
    own = {id(v) for v in layer.weights}
    pending = global_state.get_global_attribute("uninitialized_variables") or []
    global_state.set_global_attribute("uninitialized_variables", [v for v in pending if id(v) not in own])
    return [v._initializer for v in layer.trainable_variables]


def holds_memory(variable):
    """Whether `variable` has a value (False for one `unallocated_build` made)."""
    return variable._value is not None


def tensorflow_onednn_enabled():
    """Whether the loaded TensorFlow runs its oneDNN CPU kernels: `IsMklEnabled`, TensorFlow's own answer (fixed
    when TensorFlow loaded); None where that internal is gone."""
    try:
        from tensorflow.python.util import _pywrap_util_port
    except ImportError:
        return None
    return bool(_pywrap_util_port.IsMklEnabled())
