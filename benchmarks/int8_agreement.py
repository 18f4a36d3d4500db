"""Full-int8 TFLite top-1 agreement with the float model, lever by lever, on two trained models.

- digits: the main job's model (`python -m trainers.train`, a 4-layer 64-wide ViT on 8x8 digits),
  calibrated on its training digits and verified on its 360 test digits;
- B/16: ViT-B/16 itself (hidden 768, 12 blocks, 12 heads, MLP 3072, patch 16, class token) at 64 px,
  trained briefly here on the same digits upscaled: no pretrained B/16 weights are offline, and a model
  with random weights decides nothing (its head starts at zero), so its agreement would say nothing.

Both read the digits as PNG files through the exporter's own decoding (`python -m export --images`).
Each lever changes one thing from the exporter's default (`export.tflite.FLOAT_IN_INT8`, per-channel
weights, every training image to calibrate): which tensors stay float, per-tensor weights, fewer
calibration images. Its latency is the median ratio to the default's batch-1 invoke, in alternating rounds.
The exporter calibrates, then quantizes with a deny list (QuantizationDebugger, MLIR's quantizer), a path
that reads `_experimental_disable_per_channel` (the per-tensor row) and no other quantization option of the
converter: `experimental_new_quantizer` and `_experimental_disable_per_channel_quantization_for_dense_layers`
change nothing on it, so they are not rows; 16x8 is not full int8.

    python -m benchmarks.int8_agreement [--digits_model=runs/digits/model.keras] [--b16_model=b16.keras]

Without `--digits_model` it trains the main job into a temporary directory (minutes); without
`--b16_model` it trains the B/16 for `--b16_steps` (minutes more) and, with `--b16_save`, keeps it.
"""

import os
import re
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags, logging  # noqa: E402

from benchmarks import common  # noqa: E402

_DIGITS = flags.DEFINE_string("digits_model", None, "The main job's model.keras (default: train it here).")
_B16 = flags.DEFINE_string("b16_model", None, "A B/16-sized .keras model of the digits (default: train it here).")
_B16_STEPS = flags.DEFINE_integer("b16_steps", 100, "Training steps of the B/16 at batch 32.")
_B16_SAVE = flags.DEFINE_string("b16_save", None, "Where to save the B/16 trained here (.keras).")
_MODELS = flags.DEFINE_multi_enum("models", ["digits", "b16"], ["digits", "b16"], "Which models to measure.")
_ROUNDS = flags.DEFINE_integer("rounds", 7, "Alternating latency rounds (7: each lever leads one).")
_OUT = flags.DEFINE_string("out", "benchmarks/results/int8_agreement_cpu.json", "Where to write the JSON.")

B16_IMAGE_SIZE = 64  # 4x4 patches of 16 px and a class token: 17 tokens, as the digits model's 16
_SOFTMAX = r"/attention(_\d+)?/Softmax$"  # every block's softmax, by its scope in the traced model


def levers(tflite):
    """name -> (calibration images: None for all, float pattern, per-channel)."""
    default = tflite.FLOAT_IN_INT8.pattern
    start = f"{tflite._ASSEMBLY.pattern}|{tflite._FIRST_NORM.pattern}"  # the sequence's assembly, first LayerNorm
    nothing = "(?!)"  # matches no tensor
    return {
        "default (start + final LayerNorm float)": (None, default, True),
        "nothing float": (None, nothing, True),
        "start float only (the previous default)": (None, start, True),
        "+ softmax float": (None, default + "|" + _SOFTMAX, True),
        "per-tensor weights": (None, default, False),
        "calibration: 100 images": (100, default, True),
        "calibration: 300 images": (300, default, True),
    }


def train_b16(model, images, labels, steps, seed=0):
    """Trains `model` on the digits for `steps` steps of 32 (AdamW, warm-up then cosine, clipped)."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(seed)
    schedule = keras.optimizers.schedules.CosineDecay(0.0, steps, warmup_target=1e-4, warmup_steps=max(1, steps // 10))
    model.compile(keras.optimizers.AdamW(schedule, weight_decay=0.05, global_clipnorm=1.0),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=True)
    data = tf.data.Dataset.from_tensor_slices((images, labels)).shuffle(len(images), seed=seed).repeat().batch(32)
    model.fit(data, steps_per_epoch=steps, epochs=1, verbose=0)


def measure(name, model, train, test, test_labels):
    """One row per lever: agreement, logit error, float ops; then latency ratios to the default."""
    import numpy as np

    from export import tflite

    expected = model.predict(test, verbose=0)
    calibrations, variants, rows = {}, {}, []
    for lever, (count, pattern, per_channel) in levers(tflite).items():
        if count not in calibrations:
            images = train if count is None else train[np.random.default_rng(0).permutation(len(train))[:count]]
            calibrations[count] = tflite.calibrate(model, images)
        start = time.perf_counter()
        # TFLite's converter option for one weight scale per tensor (read when it quantizes).
        calibrations[count].converter._experimental_disable_per_channel = not per_channel
        variants[lever] = tflite.quantize_calibrated(calibrations[count], re.compile(pattern))
        calibrations[count].converter._experimental_disable_per_channel = False
        received = tflite.run(variants[lever], test)
        agreement = float(np.mean(received.argmax(-1) == expected.argmax(-1)))
        rows.append({
            "model": name, "lever": lever, "calibration_images": len(train) if count is None else count,
            "top1_agreement": agreement, "flips": int(round((1 - agreement) * len(test))),
            "passes": bool(agreement >= tflite.TOLERANCES["int8"]["agreement"]),
            # Mean |logit error| relative to the mean |logit|: finer than 360 images' agreement.
            "relative_logit_error": float(np.abs(received - expected).mean() / np.abs(expected).mean()),
            "float_ops": tflite.float_ops(variants[lever]),
            "float_top1": float(np.mean(expected.argmax(-1) == test_labels)),
            "seconds": time.perf_counter() - start})
        print(f"{name}: {lever}: {agreement:.4f}", flush=True)
    interpreters = {lever: tflite.make_interpreter(variant, num_threads=1) for lever, variant in variants.items()}
    calls = {lever: (lambda it=it: tflite.invoke(it, test[0])) for lever, it in interpreters.items()}
    # Alternating rounds, each starting one lever further on: whatever runs first in a round runs on a cache
    # the previous round left, and no lever is always first.
    names, samples = list(calls), {lever: [] for lever in calls}
    for round_ in range(_ROUNDS.value):
        shift = round_ % len(names)
        for lever in names[shift:] + names[:shift]:
            samples[lever].append(1000 * common.time_calls(calls[lever], 0.3))
    default = next(iter(samples))
    for row in rows:
        ms = samples[row["lever"]]
        row["latency_ms"] = common.summarize(ms)
        row["latency_vs_default"] = statistics.median(a / b for a, b in zip(ms, samples[default], strict=True))
    return rows


def b16_model(train_files):
    """`--b16_model`, or a ViT-B/16 at `B16_IMAGE_SIZE` px trained here on the digits of `train_files`."""
    import keras

    import keras_vit

    if _B16.value:
        return keras_vit.load_model(_B16.value, classifier_activation=None)
    keras.utils.set_random_seed(0)
    model = keras_vit.ViT_B16(image_size=B16_IMAGE_SIZE, classes=10, classifier_activation=None)
    train_b16(model, *common.read_digits(train_files, model), _B16_STEPS.value)
    if _B16_SAVE.value:
        model.save(_B16_SAVE.value)
    return model


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)  # TensorFlow's INFO lines of every conversion
    import tensorflow as tf

    import keras_vit
    from trainers import digits

    results = []
    with tempfile.TemporaryDirectory() as folder:
        train_files, test_files = (digits.write_pngs(os.path.join(folder, split), split) for split in ("train", "test"))
        if "digits" in _MODELS.value:
            model = keras_vit.load_model(_DIGITS.value or common.train_digits(os.path.join(folder, "digits")),
                                         classifier_activation=None)
            (train, _), (test, test_labels) = (common.read_digits(files, model) for files in (train_files, test_files))
            results += measure("digits", model, train, test, test_labels)
        if "b16" in _MODELS.value:
            model = b16_model(train_files)
            (train, _), (test, test_labels) = (common.read_digits(files, model) for files in (train_files, test_files))
            results += measure(f"B/16 at {model.input_shape[1]} px", model, train, test, test_labels)
    rows = [{"model": r["model"], "lever": r["lever"], "calib": r["calibration_images"],
             "top-1 agree": f"{r['top1_agreement']:.4f}", "flips": r["flips"],
             "rel |dlogit|": f"{r['relative_logit_error']:.4f}",
             "float ops": sum(r["float_ops"].values()), "latency vs default": f"{r['latency_vs_default']:.2f}x"}
            for r in results]
    common.print_table(rows, list(rows[0]))
    common.write_json(_OUT.value, {
        "machine": common.machine(), "tensorflow": tf.__version__, "digits_model": _DIGITS.value or "trained here",
        "b16_model": _B16.value or "trained here", "b16_steps": None if _B16.value else _B16_STEPS.value,
        "results": results})
    print(f"wrote {_OUT.value}")


if __name__ == "__main__":
    app.run(main)
