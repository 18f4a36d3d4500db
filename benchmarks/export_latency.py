"""Batch-1 latency of Keras, the SavedModel and every TFLite variant on this machine.

For ViT-Ti/16 and S/16 at 224 px (random weights: latency does not depend on
their values, as long as no two are equal, which the converter would merge),
rounds alternate the runtimes; each round also times a float32 GEMM so
the spread of the machine shows. Prints a table (median and min-max
milliseconds, and the ratios to Keras and to the SavedModel within each round)
and writes JSON.

    python -m benchmarks.export_latency [--variants=Ti/16,S/16] [--rounds=15] [--threads=N]

Every runtime gets the same `--threads` (default: every core), as TensorFlow
takes by default; LiteRT alone would take one.
"""

import os
import statistics
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import app, flags  # noqa: E402

import keras_vit  # noqa: E402
from benchmarks import common  # noqa: E402
from export import saved_model, tflite  # noqa: E402

_VARIANTS = flags.DEFINE_list("variants", ["Ti/16", "S/16"], "ViT variants.")
_ROUNDS = flags.DEFINE_integer("rounds", 15,
                               "Alternating rounds: short ones, so that the ratios within a round pair close calls.")
_SECONDS = flags.DEFINE_float("seconds", 0.5, "Seconds of calls per runtime and round.")
_THREADS = flags.DEFINE_integer("threads", os.cpu_count(),
                                "Threads of every runtime: TensorFlow's intra-op pool and LiteRT's interpreter.")
_OUT = flags.DEFINE_string("out", "benchmarks/results/export_latency_cpu.json", "Where to write the JSON.")


def runtimes(model, folder):
    """name -> a batch-1 callable on a float32 image in [-1, 1]."""
    image = np.random.default_rng(0).uniform(-1, 1, (1, 224, 224, 3)).astype("float32")
    keras_fn = tf.function(model, jit_compile=True)
    path = saved_model.export_saved_model(model, folder, name="bench")
    serving = tf.saved_model.load(str(path)).signatures["predict_float"]
    calls = {"keras (XLA)": lambda: keras_fn(image).numpy(),
             "saved_model": lambda: serving(inputs=tf.constant(image))["probabilities"].numpy()}
    calibration = np.random.default_rng(1).uniform(-1, 1, (4, 224, 224, 3)).astype("float32")
    for quantize in tflite.QUANTIZATIONS:
        interpreter = tflite.make_interpreter(tflite.convert(model, quantize, calibration), _THREADS.value)
        calls[f"tflite {quantize}"] = lambda it=interpreter: tflite.invoke(it, image[0])
    return calls


def main(argv):
    del argv
    # The same cores for every runtime: TensorFlow takes them all by default, LiteRT one.
    tf.config.threading.set_intra_op_parallelism_threads(_THREADS.value)
    results, rows = [], []
    for variant in _VARIANTS.value:
        model = keras_vit.ViT(keras_vit.decode_variant(variant), classifier_activation=None)
        with tempfile.TemporaryDirectory() as folder:
            samples, gemms = common.alternating_rounds(runtimes(model, folder), _ROUNDS.value,
                                                       lambda call: 1000 * common.time_calls(call, _SECONDS.value))
        for name, ms in samples.items():
            # Ratios within each round: the machine drifts between rounds more than within one.
            paired = {"vs_keras": [a / b for a, b in zip(ms, samples["keras (XLA)"], strict=True)],
                      "speed_up_over_saved_model": [b / a for a, b in zip(ms, samples["saved_model"], strict=True)]}
            summary = common.summarize(ms)
            results.append({"variant": variant, "runtime": name, "latency_ms": summary, "rounds_ms": ms,
                            **{key: common.summarize(values) for key, values in paired.items()},
                            "gemm_gflops": common.summarize(gemms)})
            rows.append({"variant": variant, "runtime": name,
                         "ms (median, min-max)": f"{summary['median']:.1f} ({summary['min']:.1f}-{summary['max']:.1f})",
                         "vs keras": f"{statistics.median(paired['vs_keras']):.2f}x",
                         "over SavedModel": f"{statistics.median(paired['speed_up_over_saved_model']):.2f}x"})
    common.print_table(rows, list(rows[0]))
    common.write_json(_OUT.value, {"machine": common.machine(), "tensorflow": tf.__version__,
                                   "threads": _THREADS.value, "results": results})
    print(f"wrote {_OUT.value}")


if __name__ == "__main__":
    app.run(main)
