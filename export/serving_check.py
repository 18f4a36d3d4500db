"""Proves an export the way TF Serving will use it, before it is published.

`check(path, functions, requests, xla)` starts a fresh process
(`python -m export.serving_check DIR OUT.npz [--xla]`) that loads the SavedModel
through TensorFlow's C API (`export.capi`: TF Serving's `LoadSavedModel`) and
replays every warm-up record of `assets.extra/`, as TF Serving does when it
loads a version; the answers come back in a file and are compared with the
Keras model's, computed in this process. A fresh process, because a session
that has already built the model in Python may hold the very state (variables
by name, registered functions) that a server starting cold would lack; and one
that never runs TensorFlow's Python code (`capi.without_tensorflow_runtime`), as
TF Serving, a C++ binary, never does.
"""

import os
import pathlib
import struct
import subprocess
import sys

import numpy as np

from export import capi  # the C API only: importing it loads no TensorFlow

# Float outputs through the C++ path equal the Keras model's to this (DESIGN.md).
TOLERANCE = 1e-5
TIMEOUT_S = 600
WARMUP = "tf_serving_warmup_requests"  # under assets.extra/: the requests TF Serving replays at load


def read_warmup(path):
    """The (signature, {input: numpy}) of each PredictionLog in a warm-up file, read without TensorFlow's runtime.

    The file is a TFRecord file: each record is its length (little-endian uint64), a CRC of
    the length, the bytes and their CRC. The CRCs are not checked: the exporter wrote the
    file a moment before, and TF Serving checks them when it loads.
    """
    from tensorflow_serving.apis import prediction_log_pb2

    data, start, requests = pathlib.Path(path).read_bytes(), 0, []
    while start < len(data):
        (length,) = struct.unpack_from("<Q", data, start)
        record = data[start + 12: start + 12 + length]
        start += 12 + length + 4
        request = prediction_log_pb2.PredictionLog.FromString(record).predict_log.request
        requests.append((request.model_spec.signature_name,
                         {key: proto_array(proto) for key, proto in request.inputs.items()}))
    return requests


def proto_array(proto):
    """A TensorProto as written by `tf.make_tensor_proto` (strings in `string_val`, numbers in `tensor_content`)."""
    shape = [dim.size for dim in proto.tensor_shape.dim]
    dtype = capi.DTYPES[proto.dtype]
    if dtype is object:
        array = np.empty(len(proto.string_val), object)
        array[:] = list(proto.string_val)
    else:
        array = np.frombuffer(proto.tensor_content, dtype).copy()
    if array.size != np.prod(shape, dtype=np.int64):  # e.g. one number, which goes in a typed field instead
        raise ValueError(f"A warm-up input of shape {shape} holds {array.size} values where this reader looks")
    return array.reshape(shape)


def replay(export_dir, output_file, xla=False):
    """Loads `export_dir` through the C API and saves the answer to each warm-up request.

    XLA is off, as in TF Serving's default, unless `xla` (an export written with
    `jit_compile`, which TF Serving runs only with `--xla_cpu_compilation_enabled=true`).
    """
    capi.without_tensorflow_runtime()
    if not xla:
        capi.disable_xla_compilation()
    session = capi.SavedModelSession(export_dir)
    answers = {}
    for k, (signature, inputs) in enumerate(read_warmup(pathlib.Path(export_dir) / "assets.extra" / WARMUP)):
        try:
            outputs = session.run(signature, **inputs)
        except capi.TFError as error:
            raise SystemExit(f"warm-up request {k} (signature {signature!r}) failed: {error}") from error
        for name, value in outputs.items():
            answers[f"{k}/{name}"] = value.astype(bytes) if value.dtype == object else value
    session.close()
    np.savez(output_file, **answers)


def _served(export_dir, xla):
    """Runs `replay` in a fresh process; returns its answers, or raises with what failed."""
    import tempfile

    root = str(pathlib.Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]),
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    with tempfile.TemporaryDirectory() as scratch:
        output = pathlib.Path(scratch) / "answers.npz"
        result = subprocess.run([sys.executable, "-m", "export.serving_check", str(export_dir), str(output),
                                 *(["--xla"] if xla else [])],
                                capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
        if result.returncode != 0:
            tail = "\n".join(result.stderr.strip().splitlines()[-6:])
            raise RuntimeError(f"TF Serving's loader (the TensorFlow C API, in a fresh process) could not serve "
                               f"{export_dir}:\n{tail}")
        with np.load(output) as answers:
            return dict(answers)


def check(export_dir, functions, requests, xla=False):
    """Raises unless the C++-loaded export answers every request as `functions` (Keras) does.

    Args:
        export_dir: the SavedModel directory (with its warm-up records).
        functions: {signature name: tf.function} computing the Keras model's answers.
        requests: the warm-up requests, (signature, {input: numpy}), in file order.
        xla: serve with XLA on (an export written with `jit_compile`); off, as TF Serving's default.
    """
    import tensorflow as tf

    served = _served(export_dir, xla)
    for k, (signature, inputs) in enumerate(requests):
        (value,) = inputs.values()  # one input per signature
        expected = functions[signature](tf.constant(value))
        for name, value in expected.items():
            want, got = value.numpy(), served.get(f"{k}/{name}")
            if got is None or got.shape != want.shape:
                raise RuntimeError(f"Signature {signature!r} output {name!r}: Keras gives shape {want.shape}, "
                                   f"the C++ loader {None if got is None else got.shape}")
            if want.dtype.kind == "f":
                error = float(np.abs(got - want).max()) if want.size else 0.0
                if not error <= TOLERANCE:
                    raise RuntimeError(f"Signature {signature!r} output {name!r} through the C++ loader differs "
                                       f"from Keras by {error:.2e} (allowed {TOLERANCE:.0e})")
            elif not np.array_equal(got, want.astype(got.dtype)):
                raise RuntimeError(f"Signature {signature!r} output {name!r} through the C++ loader differs "
                                   f"from Keras: {got.tolist()} against {want.tolist()}")


if __name__ == "__main__":
    replay(sys.argv[1], sys.argv[2], xla="--xla" in sys.argv[3:])
