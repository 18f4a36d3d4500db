"""Where full-int8 LiteRT spends its time: each ViT op alone, int8 against float32.

Each op of a Ti/16 forward pass at 224 px is converted alone, once float32 and
once int8 (the exporter's converter settings), and timed batch-1 on one
thread with LiteRT's default CPU delegate (XNNPACK); the row says whether the
delegate took the int8 op and what all of that op's calls in the exported
Ti/16 int8 model cost. Two rows are the forms Keras' own graph would give,
which the int8 export replaces (`export.tflite`): BATCH_MATMUL for the
attention products and LayerNorm with SQUARED_DIFFERENCE and NEG. The whole
Ti/16 int8 model is timed in the same rounds, so each exported row is also a
share of it. Rounds alternate the models and time a float32 GEMM each.

    python -m benchmarks.tflite_int8_ops [--rounds=3]
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import app, flags  # noqa: E402

import keras_vit  # noqa: E402
from benchmarks import common  # noqa: E402
from export import tflite  # noqa: E402

_ROUNDS = flags.DEFINE_integer("rounds", 3, "Alternating rounds.")
_SECONDS = flags.DEFINE_float("seconds", 0.5, "Seconds of calls per model and round.")
_OUT = flags.DEFINE_string("out", "benchmarks/results/tflite_int8_ops_cpu.json", "Where to write the JSON.")

TOKENS, WIDTH, HEADS, MLP = 197, 192, 3, 768  # Ti/16 at 224 px


def ops():
    """name -> (function, input shapes, calls in one exported Ti/16 int8 pass, int8 unfolds batch matmuls)."""
    rng = np.random.default_rng(0)
    kernel = tf.constant(rng.normal(0, 0.05, (WIDTH, MLP)).astype("float32"))
    norm = keras.layers.LayerNormalization(epsilon=1e-6)
    norm.build((1, TOKENS, WIDTH))
    norm.gamma.assign(rng.normal(1, 0.1, (WIDTH,))), norm.beta.assign(rng.normal(0, 0.1, (WIDTH,)))

    head_dim = WIDTH // HEADS
    products = (tf.matmul, [(1, HEADS, TOKENS, head_dim), (1, HEADS, head_dim, TOKENS)])
    tokens = [(1, TOKENS, WIDTH)]
    return {
        "attention products, a FULLY_CONNECTED per head (exported)": (*products, 24, True),
        "attention products as BATCH_MATMUL (Keras' graph)": (*products, 0, False),
        # 23 int8: the exporter keeps the first and the last of the 25 in float (export.tflite.FLOAT_IN_INT8).
        "LayerNorm with SUB and MUL (exported)": (lambda x: tflite._layer_norm(norm, x), tokens, 23, True),
        "LayerNorm with SQUARED_DIFFERENCE and NEG (Keras' graph)": (norm, tokens, 0, True),
        "softmax": (tf.nn.softmax, [(1, HEADS, TOKENS, TOKENS)], 12, True),
        "GELU (tanh)": (lambda x: tf.nn.gelu(x, approximate=True), [(1, TOKENS, MLP)], 12, True),
        # Both MLP layers have these multiply-adds (192 -> 768 and 768 -> 192).
        "MLP fully-connected": (lambda x: tf.matmul(x, kernel), tokens, 24, True),
    }


def convert(fn, shapes, quantize, unfold):
    """A one-op TFLite model, converted with the exporter's settings but int8 in and out (no float edges)."""
    function = tf.function(fn, input_signature=[tf.TensorSpec(shape, tf.float32) for shape in shapes])
    converter = tf.lite.TFLiteConverter.from_concrete_functions([function.get_concrete_function()], tf.Module())
    rng = np.random.default_rng(1)
    tflite.set_quantization(converter, quantize, lambda: (
        [rng.normal(size=shape).astype("float32") for shape in shapes] for _ in range(8)))
    if quantize == "int8":
        converter.inference_input_type = converter.inference_output_type = tf.int8
        converter.unfold_batchmatmul = unfold
    return converter.convert()


def interpreter_call(tflite_bytes):
    """(a call running the model once on zeros, one thread; whether XNNPACK took any of it)."""
    interpreter = tflite.make_interpreter(tflite_bytes, num_threads=1)
    for detail in interpreter.get_input_details():
        interpreter.set_tensor(detail["index"], np.zeros(detail["shape"], detail["dtype"]))
    delegated = any(op["op_name"] == "DELEGATE" for op in interpreter._get_ops_details())
    return interpreter.invoke, delegated


def main(argv):
    del argv
    calls, delegated = {}, {}
    for name, (fn, shapes, _, unfold) in ops().items():
        for quantize in ("none", "int8"):
            calls[name, quantize], delegated[name, quantize] = interpreter_call(convert(fn, shapes, quantize, unfold))
    model = keras_vit.ViT(keras_vit.decode_variant("Ti/16"), classifier_activation=None)
    calibration = np.random.default_rng(1).uniform(-1, 1, (4, 224, 224, 3)).astype("float32")
    image = calibration[0]
    interpreter = tflite.make_interpreter(tflite.convert(model, "int8", calibration), num_threads=1)
    calls["Ti/16 int8 model", "int8"] = lambda: tflite.invoke(interpreter, image)

    samples, gemms = common.alternating_rounds(calls, _ROUNDS.value,
                                               lambda call: 1000 * common.time_calls(call, _SECONDS.value))
    whole = common.summarize(samples["Ti/16 int8 model", "int8"])
    results, rows = [], []
    for name, (_, shapes, count, _) in ops().items():
        float_ms, int8_ms = common.summarize(samples[name, "none"]), common.summarize(samples[name, "int8"])
        share = count * int8_ms["median"] / whole["median"] if count else None
        results.append({"op": name, "shapes": shapes, "calls_per_model": count, "float32_ms": float_ms,
                        "int8_ms": int8_ms, "int8_delegated": delegated[name, "int8"],
                        "float32_delegated": delegated[name, "none"], "int8_share_of_model": share})
        rows.append({"op": name, "calls": count, "float32 ms": f"{float_ms['median']:.3f}",
                     "int8 ms": f"{int8_ms['median']:.3f}",
                     "int8 / float32": f"{int8_ms['median'] / float_ms['median']:.1f}x",
                     "XNNPACK takes some of int8": "yes" if delegated[name, "int8"] else "no",
                     "share of int8 model": "not exported" if share is None else f"{share:.0%}"})
    common.print_table(rows, list(rows[0]))
    print(f"Ti/16 int8 model: {whole['median']:.1f} ms (one thread)")
    common.write_json(_OUT.value, {"machine": common.machine(), "tensorflow": tf.__version__, "threads": 1,
                                   "model_int8_ms": whole, "gemm_gflops": common.summarize(gemms),
                                   "results": results})
    print(f"wrote {_OUT.value}")


if __name__ == "__main__":
    app.run(main)
