"""The one place keras_vit's layers rely on Keras internals: a layer built without memory.

`ScannedEncoder` runs `EncoderBlock`'s own math on slices of its stacked
weights through the block's public `stateless_call`, so it needs a built
block whose variables only name those slices and whose initializers draw the
stacked weights. Keras offers no public way to keep a variable unallocated
nor to read its initializer; `unallocated_build` does both with the internals
below (keras/src/backend/common/variables.py and global_state.py), checked on
the installed Keras by tests/layers/test_keras_internals.py.
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
