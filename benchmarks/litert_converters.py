"""Which converter to LiteRT survives TensorFlow's removal of `tf.lite`: four paths, four quantizations.

TF 2.20's notes say `tf.lite` leaves TensorFlow's Python packages and LiteRT holds the converter. Each path
converts the same two models, in each of the exporter's quantizations (`none`, `float16`, `dynamic`, `int8`):

- a. tf.lite: `export.tflite.convert` (TF 2.20's `TFLiteConverter`, the exporter's settings; int8 keeps
  `FLOAT_IN_INT8` in float and unfolds the attention products);
- b. litert-converter: Keras' JAX backend, `jax.export` to StableHLO, then litert-converter's own passes
  (`converter_api_ext.run_convert_to_tfl_passes`, what litert-torch runs under the hood); the float file is
  quantized with ai-edge-quantizer's recipes, as in c;
- c. litert-torch: Keras' PyTorch backend, `litert_torch.convert` (what Keras' own
  `model.export(format="litert")` calls on that backend), then ai-edge-quantizer: float16 weights
  (FLOAT_CASTING), `dynamic_wi8_afp32`, `static_wi8_ai8` calibrated on the same images as a;
- d. ai-edge-quantizer on a's float file, the same three recipes.

ai-edge-litert 2.3.0 holds a converter only as a private binding (`_pywrap_litert_converter`, JAX and
PyTorch model types) with no Python API; it is recorded, not a path.

Models: ViT-Ti/16 at 224 px with random weights drawn large enough that its head decides something (as
`tests/layer_checks.randomize_weights`) for the op lists, float agreement (max |dp| of the softmax
probabilities on 8 digits upscaled to 224 px) and speed; the main job's digits model
(`python -m trainers.train`) for agreement on all 360 test digits, full int8's top-1 agreement above all.
Both paths b and c load the TF side's weights. Ops are read from each file by LiteRT's own reader
(`export.tflite._operators`); a Flex or other custom op is not builtin. Speed is each file's batch-1,
one-thread invoke in the LiteRT interpreter as the median ratio to a's file of the same quantization, in
alternating rounds that each start one file further on and time a float32 GEMM (`benchmarks.common`).

Paths b, c and d need packages that must not share TensorFlow's environment, so they run in a worker
process of another Python: `benchmarks/.envs/litert`, made on first use from `requirements-litert.txt`
(torch 2.13, litert-torch, ai-edge-quantizer, litert-converter, jax and keras, and no TensorFlow), or
`--litert_python`; this script itself runs in the repository's venv.

    python -m benchmarks.litert_converters [--litert_python=PATH] [--digits_model=runs/digits/model.keras] [--rounds=5]

Without `--digits_model` it trains the main job into a temporary directory (minutes).
"""

import importlib.metadata
import importlib.util
import json
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags, logging  # noqa: E402

from benchmarks import common  # noqa: E402

_LITERT_PYTHON = flags.DEFINE_string("litert_python", None, "Python of a venv with litert-torch, ai-edge-quantizer and "
                                    "jax, no TF (default: benchmarks/.envs/litert from requirements-litert.txt, made "
                                    "on first use).")
_DIGITS = flags.DEFINE_string("digits_model", None, "The main job's model.keras (default: train it here).")
_ROUNDS = flags.DEFINE_integer("rounds", 5, "Alternating latency rounds.")
_SECONDS = flags.DEFINE_float("seconds", 0.3, "Seconds of invokes per file and round.")
_TI16_CALIBRATION = flags.DEFINE_integer("ti16_calibration", 32, "Training digits (at 224 px) to calibrate "
                                         "the Ti/16's int8 on (it is timed, not scored).")
_OUT = flags.DEFINE_string("out", "benchmarks/results/litert_converters_cpu.json", "Where to write the JSON.")
_WORKER = flags.DEFINE_enum("worker", None, ["torch", "jax"], "Internal: run as the worker of one Keras backend.")
_JOB = flags.DEFINE_string("job", None, "Internal: the worker's job file.")

QUANTIZATIONS = ("none", "float16", "dynamic", "int8")
PATHS = {
    "a": "tf.lite (TF 2.20)",
    "b": "litert-converter (JAX) + AEQ",
    "c": "litert-torch + AEQ",
    "d": "AEQ on a's float",
}
TI16_IMAGES = 8
MAIN_PACKAGES = ("tensorflow", "keras", "ai-edge-litert", "numpy", "jax")
WORKER_PACKAGES = ("torch", "litert-torch", "litert-converter", "ai-edge-quantizer", "ai-edge-litert", "jax",
                   "keras", "numpy", "torchao", "litert-lm-builder")


def versions(names):
    found = {}
    for name in names:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def one_line(error):
    text = " ".join(f"{type(error).__name__}: {error}".split())
    return text[:300]


def randomize_weights(model, seed=0, scale=0.3):
    """Every weight drawn from N(0, scale), as `tests/layer_checks.randomize_weights`: a zero head decides nothing."""
    import numpy as np

    rng = np.random.default_rng(seed)
    for weight in model.weights:
        weight.assign(rng.normal(0.0, scale, weight.shape).astype(weight.dtype))


# --- the worker: Keras on JAX or PyTorch, LiteRT's own converters, ai-edge-quantizer. No TensorFlow. ---


def aeq_quantize(float_bytes, quantize, calibration):
    """ai-edge-quantizer's recipe for one of the exporter's quantizations, applied to a float LiteRT file."""
    from ai_edge_litert.interpreter import Interpreter
    from ai_edge_quantizer import qtyping, quantizer, recipe

    engine = quantizer.Quantizer(bytes(float_bytes))
    if quantize == "float16":  # float16 weights, float compute: the FLOAT_CASTING algorithm
        engine.update_quantization_recipe(
            regex=".*", operation_name=qtyping.TFLOperationName.ALL_SUPPORTED,
            algorithm_key=quantizer.AlgorithmName.FLOAT_CASTING,
            op_config=qtyping.OpQuantizationConfig(
                weight_tensor_config=qtyping.TensorQuantizationConfig(num_bits=16,
                                                                      dtype=qtyping.TensorDataType.FLOAT),
                compute_precision=qtyping.ComputePrecision.FLOAT, explicit_dequantize=True))
        return engine.quantize(enable_progress_report=False).quantized_model
    if quantize == "dynamic":
        engine.load_quantization_recipe(recipe.dynamic_wi8_afp32())
        return engine.quantize(enable_progress_report=False).quantized_model
    engine.load_quantization_recipe(recipe.static_wi8_ai8())
    signatures = Interpreter(model_content=bytes(float_bytes)).get_signature_list()
    key = next(iter(signatures))
    (name,) = signatures[key]["inputs"]
    result = engine.calibrate({key: [{name: image[None]} for image in calibration]}, num_threads=1)
    return engine.quantize(result, enable_progress_report=False).quantized_model


def torch_float(model, shape):
    """The float LiteRT file of a Keras model on the PyTorch backend, as Keras' `export(format="litert")`."""
    import litert_torch
    import torch

    model.eval()
    return litert_torch.convert(model, (torch.zeros(shape),)).model_content()


def jax_float(model, shape):
    """The float LiteRT file of a Keras model on the JAX backend: StableHLO from `jax.export`, litert-converter."""
    import jax
    import jax.numpy as jnp
    from litert_converter.mlir import ir, passmanager
    from litert_converter.mlir._mlir_libs import converter_api_ext

    trainable = [v.value for v in model.trainable_variables]
    fixed = [v.value for v in model.non_trainable_variables]

    def serve(images):  # the weights are closed over: constants in the module
        return model.stateless_call(trainable, fixed, images, training=False)[0]

    exported = jax.export.export(jax.jit(serve))(jax.ShapeDtypeStruct(shape, jnp.float32))
    context = ir.Context()
    converter_api_ext.prepare_mlir_context(context)
    with context:
        module = ir.Module.parse(exported.mlir_module())
        converter_api_ext.set_signature(module.operation, signature_name="serving_default",
                                        input_names=["images"], output_names=["scores"])
        config = converter_api_ext.ConvertToTFLConfig()
        config.model_origin_framework = "JAX"
        converter_api_ext.run_convert_to_tfl_passes(module, passmanager.PassManager(), config)
        return converter_api_ext.export_flatbuffer_to_bytes(module.operation)


def worker(backend, job_path):
    """Converts the job's models on `backend` (torch: path c, and d; jax: path b); prints one JSON line."""
    import keras
    import numpy as np

    import keras_vit

    job = json.loads(open(job_path).read())
    path = {"torch": "c", "jax": "b"}[backend]
    to_float = {"torch": torch_float, "jax": jax_float}[backend]
    results = []

    def record(path, name, quantize, make):
        start = time.perf_counter()
        try:
            content = make()
        except Exception as error:  # noqa: BLE001 - a path that fails is a result
            results.append(dict(path=path, model=name, quantize=quantize, error=one_line(error)))
            return None
        file = os.path.join(job["dir"], f"{path}_{name}_{quantize}.tflite")
        with open(file, "wb") as f:
            f.write(content)
        results.append(dict(path=path, model=name, quantize=quantize, file=file,
                            convert_s=time.perf_counter() - start))
        return content

    for name, spec in job["models"].items():
        if name == "ti16":
            model = keras_vit.ViT_Ti16(weights=None)
            model.load_weights(spec["weights"])
        else:
            model = keras_vit.load_model(spec["keras"], classifier_activation=None)
        calibration = np.load(spec["calibration"])
        shape = (1, *model.input_shape[1:])
        floats = {path: record(path, name, "none", lambda m=model, s=shape: to_float(m, s))}
        if backend == "torch":
            floats["d"] = open(spec["a_float"], "rb").read()
        for source, content in floats.items():
            for quantize in QUANTIZATIONS[1:]:
                if content is None:
                    results.append(dict(path=source, model=name, quantize=quantize,
                                        error="no float file to quantize (the float conversion failed)"))
                else:
                    record(source, name, quantize, lambda c=content, q=quantize, i=calibration: aeq_quantize(c, q, i))
        keras.backend.clear_session()
    print(json.dumps({"results": results, "versions": versions(WORKER_PACKAGES), "backend": keras.backend.backend(),
                      "tensorflow_installed": importlib.util.find_spec("tensorflow") is not None,
                      "tensorflow_imported": "tensorflow" in sys.modules}))


# --- the main process: TensorFlow 2.20, Keras, the exporter, LiteRT's interpreter. ---


def run_worker(backend, job_path):
    env = {**os.environ, "KERAS_BACKEND": backend, "PYTHONPATH": os.getcwd(), "CUDA_VISIBLE_DEVICES": ""}
    from benchmarks import run

    python = run.environment_python("litert", _LITERT_PYTHON.value, run.ENVS_DIR)
    return common.worker_json([python, "-m", "benchmarks.litert_converters", f"--worker={backend}",
                               f"--job={job_path}"], f"the {backend} worker", env=env, timeout=3600)


def io_types(interpreter):
    ((input_detail,), (output_detail,)) = interpreter.get_input_details(), interpreter.get_output_details()
    return input_detail, output_detail


def feed(input_detail, image):
    """`image` batched and, for a model with an integer input (AEQ's static int8), quantized by the input's scale."""
    import numpy as np

    batch = image[None].astype(np.float32)
    if input_detail["dtype"] == np.float32:
        return batch
    scale, zero_point = input_detail["quantization"]
    limits = np.iinfo(input_detail["dtype"])
    return np.clip(np.round(batch / scale + zero_point), limits.min, limits.max).astype(input_detail["dtype"])


def run_file(tflite, content, images):
    """The file's float scores on `images`, one at a time; an integer input or output is (de)quantized here."""
    import numpy as np

    interpreter = tflite.make_interpreter(content)
    input_detail, output_detail = io_types(interpreter)
    scores = []
    for image in images:
        interpreter.set_tensor(input_detail["index"], feed(input_detail, image))
        interpreter.invoke()
        score = interpreter.get_tensor(output_detail["index"])[0].astype(np.float32)
        if output_detail["dtype"] != np.float32:
            scale, zero_point = output_detail["quantization"]
            score = (score - zero_point) * scale
        scores.append(score)
    return np.stack(scores)


def score(tflite, model, file, images, expected):
    """Op list, builtin or not, input and output types, and agreement with Keras of one file."""
    from export import common as export_common

    content = open(file, "rb").read()
    ops = {}
    for name, _, _ in tflite._operators(content):
        ops[name] = ops.get(name, 0) + 1
    input_detail, output_detail = io_types(tflite.make_interpreter(content, allocate=False))
    row = {"size_bytes": len(content), "ops": dict(sorted(ops.items())),
           "non_builtin_ops": tflite.non_builtin_ops(content),
           "io": f"{input_detail['dtype'].__name__} -> {output_detail['dtype'].__name__}"}
    try:
        row.update(export_common.compare(model, expected, run_file(tflite, content, images)))
    except Exception as error:  # noqa: BLE001 - a file LiteRT cannot run is a result
        row["run_error"] = one_line(error)
    return row


def latency(tflite, files, image):
    """Batch-1 invoke seconds of every file, alternating rounds with a GEMM; {key: [ms per round]}, [GFLOP/s]."""
    calls = {}
    for key, file in files.items():
        interpreter = tflite.make_interpreter(open(file, "rb").read(), num_threads=1)
        input_detail, output_detail = io_types(interpreter)
        batch = feed(input_detail, image)

        def call(it=interpreter, i=input_detail["index"], o=output_detail["index"], x=batch):
            it.set_tensor(i, x)
            it.invoke()
            return it.get_tensor(o)

        calls[key] = call
    return common.alternating_rounds(calls, _ROUNDS.value, lambda call: 1000 * common.time_calls(call, _SECONDS.value),
                                     rotate=True)


def main(argv):
    del argv
    if _WORKER.value:
        return worker(_WORKER.value, _JOB.value)
    logging.set_verbosity(logging.WARNING)
    import keras
    import numpy as np

    import keras_vit
    from export import tflite
    from trainers import digits

    results, workers = [], {}
    with tempfile.TemporaryDirectory() as folder:
        train_files, test_files = (digits.write_pngs(os.path.join(folder, split), split) for split in ("train", "test"))
        digits_path = _DIGITS.value or common.train_digits(os.path.join(folder, "digits"))
        digits_model = keras_vit.load_model(digits_path, classifier_activation=None)
        keras.utils.set_random_seed(0)
        ti16 = keras_vit.ViT_Ti16(weights=None)
        randomize_weights(ti16)
        ti16.save_weights(os.path.join(folder, "ti16.weights.h5"))

        digits_train, digits_test = (common.read_digits(files, digits_model)[0]
                                     for files in (train_files, test_files))
        ti16_test = common.read_digits(test_files[:TI16_IMAGES], ti16)[0]
        ti16_train = common.read_digits(train_files[:_TI16_CALIBRATION.value], ti16)[0]
        models = {"ti16": (ti16, ti16_train, ti16_test), "digits": (digits_model, digits_train, digits_test)}
        job = {"dir": folder, "models": {}}
        for name, (model, train, _) in models.items():
            np.save(os.path.join(folder, f"{name}_calibration.npy"), train)
            for quantize in QUANTIZATIONS:
                start = time.perf_counter()
                file = os.path.join(folder, f"a_{name}_{quantize}.tflite")
                try:
                    content = tflite.convert(model, quantize, train if quantize == "int8" else None)
                except Exception as error:  # noqa: BLE001
                    results.append(dict(path="a", model=name, quantize=quantize, error=one_line(error)))
                    continue
                with open(file, "wb") as f:
                    f.write(content)
                results.append(dict(path="a", model=name, quantize=quantize, file=file,
                                    convert_s=time.perf_counter() - start))
                print(f"a {name} {quantize}: {time.perf_counter() - start:.1f} s", flush=True)
            job["models"][name] = {"calibration": os.path.join(folder, f"{name}_calibration.npy"),
                                   "a_float": os.path.join(folder, f"a_{name}_none.tflite")}
        job["models"]["ti16"]["weights"] = os.path.join(folder, "ti16.weights.h5")
        job["models"]["digits"]["keras"] = digits_path
        job_path = os.path.join(folder, "job.json")
        with open(job_path, "w") as f:
            json.dump(job, f)
        for backend in ("torch", "jax"):
            start = time.perf_counter()
            try:
                workers[backend] = run_worker(backend, job_path)
            except Exception as error:  # noqa: BLE001
                workers[backend] = {"error": one_line(error)[-300:], "results": []}
            results += workers[backend]["results"]
            print(f"{backend} worker: {time.perf_counter() - start:.0f} s", flush=True)

        for row in results:
            if "file" in row:
                model, _, test = models[row["model"]]
                row.update(score(tflite, model, row["file"], test, np.asarray(model.predict(test, verbose=0))))
        timed = {(r["path"], r["quantize"]): r["file"] for r in results
                 if r["model"] == "ti16" and "file" in r and "run_error" not in r}
        samples, gemms = latency(tflite, timed, ti16_test[0])
    for row in results:
        row.pop("file", None)
        key = (row["path"], row["quantize"])
        if row["model"] == "ti16" and key in samples:
            row["latency_ms"] = common.summarize(samples[key])
            if ("a", row["quantize"]) in samples:
                ratios = [x / y for x, y in zip(samples[key], samples[("a", row["quantize"])], strict=True)]
                row["latency_vs_a"] = common.summarize(ratios)

    table = []
    for path in PATHS:
        for quantize in QUANTIZATIONS:
            rows = {r["model"]: r for r in results if r["path"] == path and r["quantize"] == quantize}
            ti, dg = rows.get("ti16", {}), rows.get("digits", {})
            table.append({
                "path": f"{path}. {PATHS[path]}", "quantize": quantize,
                "converts": "yes" if "ops" in ti else "= a" if path == "d" else "no: " + ti.get("error", "?")[:60],
                "io": ti.get("io", "-"),
                "builtin": ("yes" if not ti["non_builtin_ops"] else "no: " + ",".join(ti["non_builtin_ops"]))
                if "ops" in ti else "-",
                "op kinds": len(ti["ops"]) if "ops" in ti else "-",
                "Ti max|dp|": f"{ti['max_abs_diff_probabilities']:.1e}" if "max_abs_diff_probabilities" in ti
                else ti.get("run_error", "-")[:40],
                "digits top-1": f"{dg['top1_agreement']:.4f}" if "top1_agreement" in dg
                else (dg.get("run_error") or dg.get("error") or "-")[:40],
                "digits max|dp|": f"{dg['max_abs_diff_probabilities']:.1e}" if "max_abs_diff_probabilities" in dg
                else "-",
                "speed vs a": f"{ti['latency_vs_a']['median']:.2f}x" if "latency_vs_a" in ti else "-",
                "Ti ms": f"{ti['latency_ms']['median']:.1f}" if "latency_ms" in ti else "-",
            })
    common.print_table(table, list(table[0]))
    print(f"GEMM GFLOP/s per round: {min(gemms):.1f}-{max(gemms):.1f}")
    common.write_json(_OUT.value, {
        "machine": common.machine(), "versions": {"main": versions(MAIN_PACKAGES),
                                                  **{k: v.get("versions") for k, v in workers.items()}},
        "workers": {k: {key: value for key, value in v.items() if key not in ("results", "versions")}
                    for k, v in workers.items()},
        "paths": PATHS, "digits_model": _DIGITS.value or "trained here", "rounds": _ROUNDS.value,
        "seconds_per_file_and_round": _SECONDS.value, "gemm_gflops": common.summarize(gemms),
        "ti16_calibration_images": _TI16_CALIBRATION.value, "ti16_images": TI16_IMAGES, "results": results})
    print(f"wrote {_OUT.value}")


if __name__ == "__main__":
    app.run(main)
