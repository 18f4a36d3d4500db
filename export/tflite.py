"""TFLite export: one batch-1 float32 model per quantization, checked before it is written.

The export contract (DESIGN.md): float32, float16, dynamic-range int8 and full
int8 with a representative dataset; each variant is run in the LiteRT
interpreter and compared with the Keras model on real images, and only a
variant within its stated tolerance (`TOLERANCES`) is written. The converter
settings follow Model Garden's
`official/vision/serving/export_tflite_lib.py:convert_tflite_model` and the
TFLite post-training quantization guide.

Every variant takes the model's own input, `(1, height, width, channels)`
float32 pixels in [-1, 1] (`keras_vit.preprocess_input`), and returns float32
scores, so a caller feeds every variant the same pixels.

Full int8 and ViT (checked with TF 2.20 on ViTs with learned, sin-cos and
relative position embeddings, class token and GAP heads, and a ResNet stem):
`TFLITE_BUILTINS_INT8` alone converts them all, GELU, softmax and the
LayerNorm arithmetic (MEAN, SUB, MUL, RSQRT) included, so no float fallback
op set is needed. Every variant traces LayerNorm in ops that LiteRT runs
faster (`_litert_layer_norms`); full int8 unfolds the attention products
into FULLY_CONNECTED ops (`unfold_batchmatmul`). A few elementwise ops stay in float between
QUANTIZE/DEQUANTIZE pairs: a few NEG and SQUARE ops of a ResNet stem's
normalizations, which the converter keeps, and, by our choice, the
`FLOAT_IN_INT8` tensors (the assembly of the token sequence, the first
block's first LayerNorm, and the final LayerNorm with the pooling).
`float_ops` lists them, and `export_tflite` records them in the metadata.
"""

import contextlib
import functools
import os
import re
import statistics
import sys
import time
import warnings

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from export.choices import QUANTIZATIONS
from export.common import (
    FLOAT_TOLERANCE,
    LABELS_FILE,
    METADATA_FILE,
    ToleranceError,
    check_export_arguments,
    check_images,
    check_metadata,
    compare,
    input_and_output,
    input_shape,
    keras_scores,
    tolerance_failures,
    write_labels_and_metadata,
)
from keras_vit.atomic_files import new_directory
from keras_vit.checks import check_choice
from keras_vit.layers.encoder_block import EncoderBlock
from keras_vit.layers.scanned_encoder import ScannedEncoder, block_name

# Stated bounds, checked on the tests' trained ViT (tests/export/test_tflite.py).
TOLERANCES = {
    "none": FLOAT_TOLERANCE,
    "float16": dict(max_abs=5e-2, agreement=0.98),
    "dynamic": dict(max_abs=0.25, agreement=0.95),
    "int8": dict(agreement=0.99),
}

# Tensors full int8 keeps in float, by their scope in the traced model. At the
# start, the position-embedding layer (which assembles the sequence) and the
# first block's first LayerNorm: a class token is tiny beside the patch tokens
# (|x| <= 0.06 against 2.9 in the tests' model), so the one int8 scale of the
# sequence leaves it a level or two, which its LayerNorm then multiplies ~30x:
# on the tests' model, top-1 agreement 99.2%, and 99.8% with these ops in
# float. At the end, the final LayerNorm and the pooling: the features the head
# reads, whose one int8 scale spans the norm's largest gammas; in float, the
# logits' mean error falls by a third on the main job's digits model and to a
# quarter on a B/16 (benchmarks/int8_agreement.py; tests/export/test_tflite.py;
# BUILD.md).
_FIRST_NORM = re.compile(rf"(^|/){block_name(0)}(_\d+)?/norm_1(_\d+)?/")
_ASSEMBLY = re.compile(r"(^|/)position_embedding(_\d+)?/")
_LAST_NORM = re.compile(r"(^|/)(encoder_norm|fc_norm|pooling|distillation_pooling)(_\d+)?/")
FLOAT_IN_INT8 = re.compile("|".join(p.pattern for p in (_ASSEMBLY, _FIRST_NORM, _LAST_NORM)))

# Full int8 takes every activation's range from its calibration images, and `verify` compares on its own:
# below this many (TensorFlow's guide asks for a hundred to a few hundred) either says little about other
# images. A warning, not a refusal: the tolerance check still refuses a variant that misses on them.
MIN_INT8_IMAGES = 100


class FewImagesWarning(UserWarning):
    """Full int8 calibrated or verified on fewer than `MIN_INT8_IMAGES` images."""


def _warn_if_few(count, done):
    if count < MIN_INT8_IMAGES:
        warnings.warn(FewImagesWarning(
            f"Full int8 {done} on {count} image(s), fewer than {MIN_INT8_IMAGES}: activation ranges and agreement "
            f"measured on so few say little about other images; pass a hundred or more real images"), stacklevel=3)


LATENCY_RUNS = 10
FILE = "model_{quantize}.tflite"  # beside common.LABELS_FILE and METADATA_FILE


def convert(model, quantize="none", representative_images=None):
    """Converts a Keras 3 model to a TFLite flatbuffer.

    Args:
        model: `keras.Model` with a fixed-size image input.
        quantize: str. One of `QUANTIZATIONS`: `"none"` (float32),
            `"float16"` (float16 weights), `"dynamic"` (int8 weights,
            float activations) or `"int8"` (int8 weights and activations,
            calibrated on `representative_images`). Defaults to `"none"`.
        representative_images: float32 `(n, height, width, channels)` images
            in [-1, 1], required for `"int8"`; a few hundred real images
            cover the activation ranges. Ignored otherwise.

    Returns:
        The `.tflite` model as bytes: float32 input `(1, height, width,
        channels)` and float32 output.
    """
    check_choice(quantize, QUANTIZATIONS, "quantize")
    shape = input_shape(model)
    if quantize == "int8":
        if representative_images is None:
            raise ValueError(
                "quantize='int8' calibrates activations on `representative_images`: expected "
                "float images of shape (n, height, width, channels); received representative_images=None"
            )
        representative_images = check_images(representative_images, model, "representative_images")
        _warn_if_few(len(representative_images), "calibrated")

    if quantize == "int8":
        tflite_bytes = quantize_calibrated(calibrate(model, representative_images))
    else:
        with _litert_layer_norms(model):
            converter = _converter(model, shape)
        set_quantization(converter, quantize)
        tflite_bytes = converter.convert()
    custom = non_builtin_ops(tflite_bytes)
    if custom:
        raise ValueError(f"The {quantize!r} TFLite model needs ops outside LiteRT's builtins, which a phone's "
                         f"default runtime lacks: {custom}")
    return tflite_bytes


def _converter(model, shape):
    """A TFLite converter for `model` at the fixed input `shape`, with its weights frozen in."""
    # A fixed batch of 1: TFLite kernels and delegates want static shapes.
    serve = tf.function(
        lambda images: model(images, training=False),
        input_signature=[tf.TensorSpec(shape, tf.float32, name="images")],
    )
    # Keras 3 variables are not TF trackables: given the model itself, the
    # converter saves no weights and the interpreter reads uninitialised
    # variables (NaN outputs). A tf.Module holding the underlying tf.Variables
    # lets it freeze them.
    holder = tf.Module()
    holder.weights = [variable.value for variable in model.variables]
    return tf.lite.TFLiteConverter.from_concrete_functions([serve.get_concrete_function()], holder)


@contextlib.contextmanager
def _litert_layer_norms(model):
    """Within the block, `model`'s LayerNormalizations are traced as `_layer_norm`, which LiteRT runs faster."""
    # Others (another axis, RMS scaling, no gamma or beta) keep Keras' formulation: right, only slower.
    norms = [layer for layer in _layers(model) if isinstance(layer, keras.layers.LayerNormalization)
             and list(np.atleast_1d(layer.axis)) == [-1] and not layer.rms_scaling and layer.center and layer.scale]
    for layer in norms:
        # An instance attribute: Keras' `__call__` looks `call` up on the layer, so only these layers change.
        object.__setattr__(layer, "call", functools.partial(_layer_norm, layer))
    try:
        yield
    finally:
        for layer in norms:
            object.__delattr__(layer, "call")


def _layers(layer):
    """`layer` and the layers in it where a ViT keeps LayerNormalizations: nested models' and blocks'."""
    yield layer
    if isinstance(layer, keras.Model):
        inner = layer.layers
    elif isinstance(layer, ScannedEncoder):
        inner = [layer.template_block()]  # the block its loop calls: no tracked sublayer
    elif isinstance(layer, EncoderBlock):
        inner = [layer.norm_1, layer.norm_2]
    else:
        inner = []
    for sublayer in inner:
        yield from _layers(sublayer)


def _layer_norm(layer, inputs):
    """Keras' LayerNormalization with SUB and MUL, which XNNPACK runs in int8.

    Keras computes `x * inverse + (beta - mean * inverse)`, with the variance
    from SQUARED_DIFFERENCE and `-mean` from NEG. LiteRT has no int8 NEG (the
    converter keeps each in float between QUANTIZE and DEQUANTIZE) and runs
    int8 SQUARED_DIFFERENCE outside XNNPACK with a slow kernel. Here the same
    function is `(x - mean) * (inverse * gamma) + beta`, with the variance
    the mean of `(x - mean) * (x - mean)`, and the tests' model stays as
    close to Keras' as before. In float32 it is also fewer ops, and runs
    faster (BUILD.md, "Export and serving").
    """
    x = ops.cast(inputs, "float32")
    centered = x - ops.mean(x, axis=-1, keepdims=True)
    inverse = ops.rsqrt(ops.mean(centered * centered, axis=-1, keepdims=True) + layer.epsilon)
    return ops.cast(centered * (inverse * layer.gamma) + layer.beta, layer.compute_dtype)


def set_quantization(converter, quantize, representative_dataset=None):
    """Sets the converter's optimizations, op sets and types for one of `QUANTIZATIONS`.

    `representative_dataset`: for `"int8"`, a callable that yields lists of
    input arrays to calibrate on (TFLite's convention).
    """
    if quantize != "none":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if quantize == "float16":
        converter.target_spec.supported_types = [tf.float16]
    elif quantize == "int8":
        converter.representative_dataset = representative_dataset
        # INT8 alone converts ViT, GELU, softmax and LayerNorm included (see the
        # module docstring), so there is no TFLITE_BUILTINS float fallback: a
        # model that needs one fails here rather than silently running in float.
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        # Float input and output, quantized inside: callers feed the same pixels
        # to every variant.
        converter.inference_input_type = tf.float32
        converter.inference_output_type = tf.float32
        # The attention products as one FULLY_CONNECTED per head: LiteRT runs int8
        # BATCH_MATMUL outside XNNPACK with a kernel several times slower than its
        # int8 FULLY_CONNECTED (benchmarks/tflite_int8_ops.py).
        converter.unfold_batchmatmul = True
    else:
        # Builtin ops only, never SELECT_TF_OPS: a phone's default LiteRT runtime has no Flex delegate.
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]


def calibrate(model, representative_images):
    """Runs `representative_images` through `model`'s TFLite graph and records every tensor's range.

    TFLite's QuantizationDebugger is the public way to keep chosen tensors in
    float: it calibrates once, then quantizes with a deny list of output
    tensor names, which exist only in its calibrated model. One calibration
    serves any number of `quantize_calibrated` calls (benchmarks/int8_agreement.py).

    Args:
        model: `keras.Model` with a fixed-size image input.
        representative_images: float32 `(n, height, width, channels)` images in the model's input range.

    Returns:
        The calibration, for `quantize_calibrated`.
    """
    images = check_images(representative_images, model, "representative_images")
    with _litert_layer_norms(model):
        converter = _converter(model, input_shape(model))
    set_quantization(converter, "int8", lambda: ([image[None]] for image in images))
    with warnings.catch_warnings():
        # The debugger runs TF's own tf.lite.Interpreter, which warns of its deprecation.
        warnings.filterwarnings("ignore", r"\s*Warning: tf.lite.Interpreter is deprecated", UserWarning)
        return tf.lite.experimental.QuantizationDebugger(
            converter=converter, debug_dataset=converter.representative_dataset)


def quantize_calibrated(debugger, float_in_int8=None):
    """The int8 model of a `calibrate` result, with the tensors `float_in_int8` matches kept in float.

    Weights are quantized per output channel (TFLite's default).

    Args:
        debugger: what `calibrate` returned.
        float_in_int8: compiled pattern of tensor scopes. Defaults to `FLOAT_IN_INT8`.

    Returns:
        The `.tflite` model as bytes.
    """
    float_in_int8 = FLOAT_IN_INT8 if float_in_int8 is None else float_in_int8
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", r"\s*Warning: tf.lite.Interpreter is deprecated", UserWarning)
        calibrated = make_interpreter(debugger.calibrated_model, delegates=False, allocate=False)
        # A fused op's name joins its parts with ";": kept only if every part is in scope.
        kept = [
            tensor["name"]
            for tensor in calibrated.get_tensor_details()
            if all(float_in_int8.search(part) for part in tensor["name"].split(";"))
        ]
        # A scanned model's first LayerNorm is in the loop body all blocks share, where the
        # sequence is quantized anyway: then the assembly before it is not kept either.
        if not any(_FIRST_NORM.search(name) for name in kept):
            kept = [name for name in kept if not _ASSEMBLY.search(name)]
        if kept or debugger.options.denylisted_nodes:  # a new deny list re-quantizes the debug model
            debugger.options = tf.lite.experimental.QuantizationDebugOptions(denylisted_nodes=kept or None)
        return debugger.get_nondebug_quantized_model()


def non_builtin_ops(tflite_bytes):
    """Names of the ops that are not LiteRT builtins (Flex or other custom ops), sorted; empty if none."""
    return sorted({name for name, custom, _ in _operators(tflite_bytes) if custom})


def _operators(tflite_bytes):
    """`(name, custom?, float32 output?)` of every op in every subgraph (a scanned model's loop body too).

    Read from the flatbuffer by LiteRT's own reader (`ai_edge_litert.tools.flatbuffer_utils`): the
    interpreter lists only the first subgraph. A builtin is named as in LiteRT
    (`"FULLY_CONNECTED"`), a custom op by its code (`"FlexErf"`).
    """
    from ai_edge_litert.tools import flatbuffer_utils

    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(tflite_bytes))
    for subgraph in model.subgraphs:
        for op in subgraph.operators:
            name = flatbuffer_utils.opcode_to_name(model, op.opcodeIndex)
            custom = name == "CUSTOM"
            if custom:
                name = model.operatorCodes[op.opcodeIndex].customCode.decode()
            types = [flatbuffer_utils.type_to_name(subgraph.tensors[index].type) for index in op.outputs if index >= 0]
            yield name, custom, "FLOAT32" in types


def make_interpreter(tflite_bytes, num_threads=None, delegates=True, allocate=True):
    # Imported here: the LiteRT runtime is the `export` extra, not a core dependency.
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    resolver = OpResolverType.AUTO if delegates else OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    interpreter = Interpreter(
        model_content=tflite_bytes, num_threads=num_threads, experimental_op_resolver_type=resolver
    )
    if allocate:
        interpreter.allocate_tensors()
    return interpreter


def invoke(interpreter, image):
    (input_detail,) = interpreter.get_input_details()
    (output_detail,) = interpreter.get_output_details()
    interpreter.set_tensor(input_detail["index"], image[None])
    interpreter.invoke()
    return interpreter.get_tensor(output_detail["index"])[0]


def run(tflite_bytes, images):
    """Runs images through a batch-1 TFLite model in the LiteRT interpreter.

    Args:
        tflite_bytes: bytes. A model from `convert`.
        images: float32 `(n, height, width, channels)` images in [-1, 1].

    Returns:
        numpy array `(n, ...)`: the model's outputs, one image at a time,
        stacked.
    """
    interpreter = make_interpreter(tflite_bytes)
    (input_detail,) = interpreter.get_input_details()
    images = np.asarray(images, np.float32)
    expected = tuple(input_detail["shape"][1:])
    if images.ndim != 4 or images.shape[1:] != expected:
        raise ValueError(
            f"`images` must have shape (n, {', '.join(map(str, expected))}); received shape {images.shape}"
        )
    return np.stack([invoke(interpreter, image) for image in images])


def latency_ms(tflite_bytes, image, runs=LATENCY_RUNS):
    """Median wall time of one batch-1 `invoke`, in milliseconds, on one thread.

    Args:
        tflite_bytes: bytes. A model from `convert`.
        image: float32 `(height, width, channels)` image.
        runs: int. Timed invocations after one untimed warm-up. Defaults to
            `LATENCY_RUNS`.

    Returns:
        float.
    """
    # One thread: comparable between variants and machines of any core count.
    interpreter = make_interpreter(tflite_bytes, num_threads=1)
    invoke(interpreter, image)  # the first invoke prepares the delegate
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        invoke(interpreter, image)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def float_ops(tflite_bytes):
    """Counts the ops of a TFLite model that compute in float32.

    QUANTIZE and DEQUANTIZE, which only change types, are not counted. For a
    float model this is nearly every op; for a full-int8 one, the ops the
    converter left in float.

    Args:
        tflite_bytes: bytes. A model from `convert`.

    Returns:
        dict from op name (e.g. `"NEG"`) to count.
    """
    counts = {}
    for name, _, computes_in_float in _operators(tflite_bytes):
        if computes_in_float and name not in ("QUANTIZE", "DEQUANTIZE"):
            counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items()))


def verify(tflite_bytes, model, images):
    """Compares a TFLite model with the Keras model it came from.

    Args:
        tflite_bytes: bytes. A model from `convert(model, ...)`.
        model: the `keras.Model`.
        images: float32 `(n, height, width, channels)` real images in [-1, 1].

    Returns:
        dict with `max_abs_diff_probabilities` (largest |difference| of the
        class probabilities, softmax applied to both when the model returns
        logits), `top1_agreement` (fraction of images with the same top
        class), `size_bytes`, `latency_ms` (median batch-1 invoke, see
        `latency_ms`) and `num_images`.
    """
    images = check_images(images, model, "images")
    return {
        **compare(model, keras_scores(model, images), run(tflite_bytes, images)),
        "size_bytes": len(tflite_bytes),
        "latency_ms": latency_ms(tflite_bytes, images[0]),
        "num_images": len(images),
    }


def check_tolerance(quantize, result):
    """Returns the ways `result` (from `verify`) misses `TOLERANCES[quantize]`; empty if none."""
    check_choice(quantize, QUANTIZATIONS, "quantize")
    return tolerance_failures(TOLERANCES[quantize], result)


def export_tflite(
    model,
    output_dir,
    quantize="none",
    representative_images=None,
    verify_images=None,
    labels=None,
    metadata=None,
    force=False,
):
    """Converts, verifies and writes one TFLite variant with its labels and metadata.

    Nothing is written unless the variant is within `TOLERANCES[quantize]`
    of the Keras model on `verify_images` (or `force=True`). The files are
    written into a temporary directory beside `output_dir`, which is renamed
    into place last, so an interrupted export leaves no directory that looks
    complete.

    Args:
        model: `keras.Model` with a fixed-size image input.
        output_dir: str or path. Must not exist; its parent is created.
        quantize: str. One of `QUANTIZATIONS`. Defaults to `"none"`.
        representative_images: float32 images in [-1, 1] to calibrate
            `"int8"`. Ignored by the other modes.
        verify_images: float32 `(n, height, width, channels)` real images in
            [-1, 1]. Required.
        labels: optional list of class names, one per output, written to
            `labels.txt`.
        metadata: optional JSON-serialisable dict merged into
            `metadata.json` (e.g. the source checkpoint).
        force: bool. Write a variant that misses its tolerance, with a
            warning. Defaults to False.

    Returns:
        dict: `verify`'s numbers plus `quantize`, `float_ops`, `num_calibration_images`, `forced`,
        `output_dir`, `tflite_path`, `labels_path` (None without labels)
        and `metadata_path`.

    Raises:
        ToleranceError: the variant misses its tolerance and `force` is
            False; nothing was written.
        ValueError: an argument is not what the export takes.
    """
    check_choice(quantize, QUANTIZATIONS, "quantize")
    output_dir, verify_images, labels = check_export_arguments(model, output_dir, verify_images, labels, "TFLite")

    tflite_bytes = convert(model, quantize, representative_images)
    if quantize == "int8":
        _warn_if_few(len(verify_images), "verified")
    result = verify(tflite_bytes, model, verify_images)
    failures = _refuse_unless_forced(quantize, result, force)
    result = {
        "quantize": quantize,
        **result,
        "tolerance": dict(TOLERANCES[quantize]),
        "float_ops": float_ops(tflite_bytes),
        "num_calibration_images": len(representative_images) if quantize == "int8" else 0,
        "forced": bool(failures),
    }
    metadata = check_metadata(metadata, {**result, **input_and_output(model)})
    return {**result, **_write_variant(output_dir, quantize, tflite_bytes, labels, metadata)}


def from_command_line(model, request):
    """`python -m export --format=tflite`: writes the `--quantize` variant and prints its row of `print_table`."""
    quantize = request.options["quantize"]
    result = export_tflite(model, request.output, quantize, representative_images=request.calibration,
                           verify_images=request.images, labels=request.labels, metadata=request.metadata,
                           force=request.options["force"])
    print_table([{"quantize": quantize, **result}])


def _refuse_unless_forced(quantize, result, force):
    """Raises if `result` misses `TOLERANCES[quantize]`, or only warns under `force`; returns the misses."""
    failures = check_tolerance(quantize, result)
    if failures and not force:
        raise ToleranceError(
            f"The {quantize!r} TFLite model is not within its tolerance {TOLERANCES[quantize]} of the "
            f"Keras model on {result['num_images']} images: {'; '.join(failures)}. Nothing was written; "
            "pass force=True (on the command line, --force) to write it anyway"
        )
    if failures:
        warnings.warn(
            f"WRITING A TFLITE MODEL THAT FAILED VERIFICATION (force=True): {quantize!r} is not within "
            f"{TOLERANCES[quantize]} of the Keras model: {'; '.join(failures)}",
            stacklevel=3,  # export_tflite's caller
        )
    return failures


def _write_variant(output_dir, quantize, tflite_bytes, labels, metadata):
    """Writes the variant, its labels and metadata under a staging name renamed to `output_dir` last; returns their
    paths. An interrupted export so leaves no directory that looks complete."""
    tflite_name = FILE.format(quantize=quantize)
    with new_directory(output_dir) as staging:
        with open(os.path.join(staging, tflite_name), "wb") as f:
            f.write(tflite_bytes)
        write_labels_and_metadata(staging, labels, metadata)
    return {
        "output_dir": output_dir,
        "tflite_path": os.path.join(output_dir, tflite_name),
        "labels_path": os.path.join(output_dir, LABELS_FILE) if labels is not None else None,
        "metadata_path": os.path.join(output_dir, METADATA_FILE),
    }


def print_table(rows, file=None):
    """Prints size, top-1 agreement, max |Δp| and latency, one row per variant.

    Args:
        rows: iterable of dicts with `quantize` and `verify`'s keys (e.g.
            `export_tflite`'s results).
        file: text stream. Defaults to `sys.stdout`.
    """
    file = file or sys.stdout
    header = f"{'variant':<8} {'size KiB':>9} {'top-1 agree':>11} {'max |dp|':>9} {'latency ms':>10}"
    print(header, file=file)
    print("-" * len(header), file=file)
    for row in rows:
        print(
            f"{row['quantize']:<8} {row['size_bytes'] / 1024:>9.1f} {row['top1_agreement']:>11.3f} "
            f"{row['max_abs_diff_probabilities']:>9.2e} {row['latency_ms']:>10.3f}",
            file=file,
        )
