"""Request latency of a keras_vit export against Keras' own `model.export()`, both as TF Serving loads them.

Both SavedModels of the same model (random weights: latency does not depend on
them) are loaded through TensorFlow's C API (`export.capi`, TF Serving's
`LoadSavedModel` and `Session::Run`) in this process, and answer batch-1
requests in alternating rounds, each round also timing a float32 GEMM so the
machine's drift shows. Rows:

- keras_vit `serving_default`: JPEG bytes in (a 500x375 photo-sized image),
  decoded, resized and scaled inside the graph; probabilities and top-k out.
- keras_vit `predict_float`: the model's own float input, as Keras' export takes.
- Keras `model.export()` `serve`: float input, logits out (a client must decode
  and resize the image itself).
- the same two keras_vit signatures of an export written with `jit_compile=True`
  (the model under XLA; TF Serving runs it with `--xla_cpu_compilation_enabled=true`).

Prints p50 and p99 per runtime (median over rounds, with min-max) and the ratio
to Keras' export in the same round, and writes JSON.

    python -m benchmarks.serving_latency [--variants=Ti/16,B/16] [--rounds=3] [--requests=100]
"""

import os
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import app, flags  # noqa: E402

import keras_vit  # noqa: E402
from benchmarks import common  # noqa: E402
from export import capi, saved_model  # noqa: E402

_VARIANTS = flags.DEFINE_list("variants", ["Ti/16", "B/16"], "ViT variants.")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Alternating rounds.")
_REQUESTS = flags.DEFINE_integer("requests", 100, "Timed requests per runtime and round (after 3 untimed).")
_OUT = flags.DEFINE_string("out", "benchmarks/results/serving_latency_cpu.json", "Where to write the JSON.")
KERAS = "keras model.export (float in)"


def photo_jpeg():
    """A 500x375 JPEG with photo-like structure (smooth gradients plus noise)."""
    rng = np.random.default_rng(0)
    y, x = np.meshgrid(np.linspace(0, 1, 375), np.linspace(0, 1, 500), indexing="ij")
    base = np.stack([x, y, 1 - x * y], -1) * 200 + rng.normal(0, 20, (375, 500, 3))
    return tf.io.encode_jpeg(np.clip(base, 0, 255).astype(np.uint8), quality=90).numpy()


def requests(model, folder):
    """name -> a batch-1 request through the C API."""
    ours = capi.SavedModelSession(saved_model.export_saved_model(model, folder, name="ours"))
    xla = capi.SavedModelSession(saved_model.export_saved_model(model, folder, name="ours_xla", jit_compile=True))
    model.export(os.path.join(folder, "keras"), format="tf_saved_model", verbose=False)
    keras_session = capi.SavedModelSession(os.path.join(folder, "keras"))
    (keras_input,) = keras_session.signatures["serve"].inputs
    image = np.random.default_rng(1).uniform(-1, 1, (1, 224, 224, 3)).astype(np.float32)
    jpeg = np.array([photo_jpeg()], dtype=object)
    return {
        "keras_vit serving_default (JPEG in)": lambda: ours.run("serving_default", images=jpeg),
        "keras_vit predict_float (float in)": lambda: ours.run("predict_float", inputs=image),
        "keras_vit --jit_compile serving_default (JPEG in)": lambda: xla.run("serving_default", images=jpeg),
        "keras_vit --jit_compile predict_float (float in)": lambda: xla.run("predict_float", inputs=image),
        KERAS: lambda: keras_session.run("serve", **{keras_input: image}),
    }


def percentiles(call, count):
    for _ in range(3):
        call()
    times = []
    for _ in range(count):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e3)
    return {"p50": float(np.percentile(times, 50)), "p99": float(np.percentile(times, 99))}


def main(argv):
    del argv
    results, rows = [], []
    for variant in _VARIANTS.value:
        model = keras_vit.ViT(keras_vit.decode_variant(variant), classifier_activation=None)
        with tempfile.TemporaryDirectory() as folder:
            samples, gemms = common.alternating_rounds(requests(model, folder), _ROUNDS.value,
                                                       lambda call: percentiles(call, _REQUESTS.value))
        for name, rounds in samples.items():
            entry = {"variant": variant, "runtime": name, "gemm_gflops": common.summarize(gemms)}
            row = {"variant": variant, "runtime": name}
            for key in ("p50", "p99"):
                values = [r[key] for r in rounds]
                ratios = [r[key] / k[key] for r, k in zip(rounds, samples[KERAS], strict=True)]
                entry[f"{key}_ms"], entry[f"{key}_vs_keras"] = common.summarize(values), common.summarize(ratios)
                row[f"{key} ms"] = f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"
                row[f"{key} / keras"] = f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"
            results.append(entry)
            rows.append(row)
    common.print_table(rows, list(rows[0]))
    common.write_json(_OUT.value, {"machine": common.machine(), "tensorflow": tf.__version__,
                                   "requests_per_round": _REQUESTS.value, "results": results})
    print(f"wrote {_OUT.value}")


if __name__ == "__main__":
    app.run(main)
