"""What Keras' private `run_layer_test` does, for our layers.

`check_layer` asserts that a layer's config round-trips, that a `.keras`
save and load gives equal outputs, that `compute_output_shape` matches the
real output, and that one training step moves every trainable weight.
"""

import keras
import numpy as np


def _symbolic(array):
    return keras.Input(batch_shape=(None, *array.shape[1:]), dtype=str(array.dtype))


def check_layer(layer, tmp_path, *args, randomize=False, still=(), **kwargs):
    """Runs the standard checks on `layer` called as `layer(*args, **kwargs)`.

    `args` and `kwargs` hold numpy arrays (batch first). `randomize` redraws
    the weights first, for layers whose initialisation blocks some gradients
    (a zero-initialised scale). `still`: the paths of weights whose gradient
    is zero by construction (a shift of every key, which softmax ignores).
    Returns the output.
    """
    config = layer.get_config()
    clone = type(layer).from_config(config)
    assert clone.get_config() == config

    sym_args = [_symbolic(a) for a in args]
    sym_kwargs = {k: _symbolic(v) for k, v in kwargs.items()}
    model = keras.Model([*sym_args, *sym_kwargs.values()], layer(*sym_args, **sym_kwargs))
    inputs = [*args, *kwargs.values()]
    if randomize:
        randomize_weights(layer)
    outputs = np.asarray(model(inputs))

    if type(layer).compute_output_shape is not keras.layers.Layer.compute_output_shape:
        shapes = [a.shape for a in args]
        kw_shapes = {f"{k}_shape": v.shape for k, v in kwargs.items()}
        assert tuple(layer.compute_output_shape(*shapes, **kw_shapes)) == outputs.shape

    path = tmp_path / f"{layer.name}.keras"
    model.save(path)
    reloaded = keras.models.load_model(path, safe_mode=True)
    np.testing.assert_array_equal(np.asarray(reloaded(inputs)), outputs)

    if layer.trainable_weights:
        before = [w.numpy().copy() for w in layer.trainable_weights]
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        target = np.random.default_rng(0).normal(size=outputs.shape).astype("float32")
        model.fit(inputs, target, epochs=1, batch_size=len(args[0]), verbose=0)
        for old, new in zip(before, layer.trainable_weights, strict=True):
            assert np.array_equal(old, new.numpy()) == (new.path in still), f"{new.path} moved or did not move"
    return outputs


def randomize_weights(layer, seed=0, scale=0.3):
    """Gives every weight non-trivial random values (zero heads would hide bugs)."""
    rng = np.random.default_rng(seed)
    for weight in layer.weights:
        weight.assign(rng.normal(0.0, scale, weight.shape).astype(weight.dtype))
