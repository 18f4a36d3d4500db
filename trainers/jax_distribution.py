"""The `keras.distribution` a run asks for on Keras' JAX backend: the route to GPUs and TPUs past tf.distribute.

- `auto` and `data_parallel`: every batch is split over all devices (`DataParallel`), every weight replicated:
  each GPU, each TPU core, or the CPU devices `XLA_FLAGS=--xla_force_host_platform_device_count=N` makes.
- `model_parallel`: a (batch, model) device mesh; the attention's query/key/value/output kernels are split
  over its model axis by head and the MLP's by hidden unit (a `LayoutMap`, Megatron's layout), the batch over
  the rest. `--model_axis_size` devices hold one copy of the model (default: all of them).
- `cpu`: one device, no distribution.

One host only, for now: KERAS_DISTRIBUTION_NUM_PROCESSES above 1 (`keras.distribution.initialize`'s
several hosts) is refused. Two local processes train together, but Keras shards the evaluation split by
batch, and its last, partial batch gives the hosts different step counts, so one waits for the other forever.
The strategy is set globally (`keras.distribution.set_distribution`): `fit` reads it there.
"""

import contextlib
import os

STRATEGIES = ("auto", "data_parallel", "model_parallel", "cpu")
# The tf.distribute strategies, which name TensorFlow's devices: on JAX the same devices are data_parallel's.
TENSORFLOW_ONLY = ("tpu", "gpu", "multi_worker")
MODEL_AXIS = "model"
# How the split kernels' axes lie on the mesh: heads and hidden units on the model axis.
_SPLIT = (
    ("attention{}(query|key|value)_kernel", (None, MODEL_AXIS, None)),
    ("attention{}(query|key|value)_bias", (MODEL_AXIS, None)),
    ("attention{}output_kernel", (MODEL_AXIS, None, None)),
    ("mlp{0}dense_1{0}kernel", (None, MODEL_AXIS)),
    ("mlp{0}dense_1{0}bias", (MODEL_AXIS,)),
    ("mlp{0}dense_2{0}kernel", (MODEL_AXIS, None)),
)
# Their variables' paths: unrolled `encoder_block_3/attention/query_kernel`; scanned
# `encoder/attention-query_kernel`, whose leading axis is the layer's.
_LAYOUT = tuple((rf"{name.format('/')}$", axes) for name, axes in _SPLIT) + tuple(
    (rf"{name.format('-')}$", (None, *axes)) for name, axes in _SPLIT)


def check_strategy(name, model_axis_size):
    """ValueError naming the flag when `--strategy`/`--model_axis_size` cannot run on JAX (no device touched)."""
    if name in TENSORFLOW_ONLY:
        raise ValueError(f"--strategy={name} is a tf.distribute strategy (KERAS_BACKEND=tensorflow); on Keras' "
                         f"JAX backend use --strategy=auto or data_parallel (every local GPU or TPU core) or "
                         f"model_parallel")
    if name not in STRATEGIES:
        raise ValueError(f"--strategy must be one of {STRATEGIES} on Keras' JAX backend; received strategy={name!r}")
    if model_axis_size and name != "model_parallel":
        raise ValueError(f"--model_axis_size={model_axis_size} sizes model_parallel's model axis; received "
                         f"--strategy={name}")


class KerasDistribution:
    """What the training loop asks of a strategy, for a `keras.distribution` set globally."""

    cluster_resolver = None  # tf.distribute's; the hosts here are JAX processes

    def __init__(self, kind, num_replicas_in_sync):
        import jax

        self.kind = kind  # "cpu", "gpu" or "tpu": the devices' platform
        self.num_replicas_in_sync = num_replicas_in_sync  # the batch's shards
        self.is_chief = jax.process_index() == 0  # always, while one host runs (check_one_host)
        self.num_devices = jax.device_count()

    def scope(self):
        return contextlib.nullcontext()  # the distribution is global: variables and `fit` both read it there


def check_one_host():
    """ValueError when KERAS_DISTRIBUTION_NUM_PROCESSES asks for several hosts (see the module's docstring)."""
    count = os.environ.get("KERAS_DISTRIBUTION_NUM_PROCESSES", "")
    if count not in ("", "1"):
        raise ValueError(f"KERAS_DISTRIBUTION_NUM_PROCESSES={count}: the trainer runs on one host on Keras' JAX "
                         "backend (its evaluation would hang across hosts); unset it, or train on several hosts "
                         "with KERAS_BACKEND=tensorflow and TF_CONFIG (--strategy=multi_worker)")


def make_distribution(name="auto", model_axis_size=0, model_config=None):
    """Sets the run's distribution globally and returns it as a `KerasDistribution`.

    ValueError naming the flag or `model_config`'s field that does not fit the devices (nothing set then).
    """
    import jax
    import keras

    check_strategy(name, model_axis_size)
    check_one_host()
    devices = jax.devices()
    kind = jax.default_backend()
    if name == "cpu" or (name == "auto" and len(devices) == 1):
        keras.distribution.set_distribution(None)
        return KerasDistribution(kind, 1)
    if name in ("auto", "data_parallel"):
        distribution = keras.distribution.DataParallel(devices=devices)
        keras.distribution.set_distribution(distribution)
        return KerasDistribution(kind, len(devices))
    model = model_axis_size or len(devices)
    if len(devices) % model:
        raise ValueError(f"--model_axis_size={model} must divide the {len(devices)} devices")
    if model_config is not None:
        check_model_fits(model_config, model)
    mesh = keras.distribution.DeviceMesh((len(devices) // model, model), ["batch", MODEL_AXIS], devices)
    layouts = keras.distribution.LayoutMap(mesh)
    for pattern, axes in _LAYOUT:
        layouts[pattern] = axes
    distribution = keras.distribution.ModelParallel(layout_map=layouts, batch_dim_name="batch")
    keras.distribution.set_distribution(distribution)
    return KerasDistribution(kind, len(devices) // model)


def check_model_fits(config, model_axis_size):
    """ValueError naming the field when the heads or MLP units do not split over the model axis."""
    problems = [f"`{field}`={value} must be a multiple of the model axis' {model_axis_size} devices"
                for field, value in (("num_heads", config.num_heads), ("mlp_dim", config.mlp_dim))
                if value % model_axis_size]
    if problems:
        raise ValueError("; ".join(problems) + " (--strategy=model_parallel, --model_axis_size)")
