"""Inference throughput of keras_vit on this machine, XLA on and off.

For each variant and batch size, rounds alternate XLA off and on (A B A B),
and each round also times a float32 GEMM, so every figure is reported as a
fraction of the machine's own matmul throughput measured in that round.

    python -m benchmarks.inference [--variants=Ti/16,S/16,B/16] [--batch_sizes=1,8]
        [--rounds=3] [--seconds=2] [--out=benchmarks/results/inference_cpu.json]

Prints a table and writes JSON (medians with min-max over rounds).
"""

import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402
from absl import app, flags  # noqa: E402

import keras_vit  # noqa: E402
from benchmarks import common  # noqa: E402

_VARIANTS = flags.DEFINE_list("variants", ["Ti/16", "S/16", "B/16"], "ViT variants to measure.")
_BATCH_SIZES = flags.DEFINE_list("batch_sizes", ["1", "8"], "Batch sizes to measure.")
_IMAGE_SIZE = flags.DEFINE_integer("image_size", 224, "Square input resolution.")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Alternating timing rounds per configuration.")
_SECONDS = flags.DEFINE_float("seconds", 2.0, "Seconds of calls per round and mode.")
_OUT = flags.DEFINE_string("out", "benchmarks/results/inference_cpu.json", "Where to write the JSON.")


def measure(variant, batch, image_size, rounds, seconds):
    """Returns the measurements of one variant at one batch size."""
    fields = keras_vit.decode_variant(variant)
    model = keras_vit.ViT(**fields, image_size=image_size, classifier_activation=None)
    images = tf.random.uniform((batch, image_size, image_size, 3), -1, 1)
    flops = common.vit_forward_flops(image_size, **fields) * batch
    modes = {"xla_off": tf.function(model, jit_compile=False), "xla_on": tf.function(model, jit_compile=True)}
    first_call = {}
    for name, fn in modes.items():
        start = time.perf_counter()
        fn(images).numpy()
        first_call[name] = time.perf_counter() - start
    calls = {name: (lambda fn=fn: fn(images).numpy()) for name, fn in modes.items()}
    result = {"variant": variant, "batch": batch, "image_size": image_size, "gflop_per_call": flops / 1e9,
              **common.alternate_rounds(calls, batch, flops, rounds, seconds)}
    for name in modes:
        result[name]["first_call_s"] = first_call[name]
    return result


def main(argv):
    del argv
    results = []
    for variant in _VARIANTS.value:
        for batch in map(int, _BATCH_SIZES.value):
            results.append(measure(variant, batch, _IMAGE_SIZE.value, _ROUNDS.value, _SECONDS.value))
            print(f"measured {variant} batch {batch}", flush=True)
    rows = common.xla_rows(results, "first_call_s", "first call s")
    common.print_table(rows, list(rows[0]))
    common.write_json(_OUT.value, {"machine": common.machine(), "tensorflow": tf.__version__,
                                   "keras_vit": keras_vit.__version__, "results": results})
    print(f"wrote {_OUT.value}")


if __name__ == "__main__":
    app.run(main)
