"""A stand-in for `tensorflow_model_server` and OpenVINO Model Server: TF Serving's REST and gRPC front over the
runtime each server runs.

The docs' `curl` and gRPC examples run verbatim against it (tests/test_docs.py). Only the HTTP and gRPC framing is
ours, written to TF Serving's REST API (row format: `instances`, `{"b64": ...}` for bytes, one `predictions` entry
per instance; `GET .../metadata`) and its `PredictionService.Predict`. The newest numbered version under
`--base_path` is served as the server that reads its files would serve it:

- a SavedModel, as TF Serving: through `export.capi.SavedModelSession`, the C++ `LoadSavedModel` and `Session::Run`
  that TF Serving runs, XLA off as its default. Bad requests answer InvalidArgument as the server does (HTTP 400).
- an `.xml` IR (with its `.bin`) or an `.onnx` file, any name, as OVMS (OpenVINO Model Server): compiled by
  OpenVINO's CPU runtime in float32 (OVMS's `--plugin_config '{"INFERENCE_PRECISION_HINT": "f32"}'`), inputs and
  outputs named by the model's tensor names, one signature, `serving_default` in the metadata, and
  `signature_name` ignored: OVMS's Predict reads only the model's name and version. A request whose input names,
  dtype or shape do not fit is refused with OVMS's messages (`Missing input with specific name - Required input:
  inputs`), InvalidArgument or HTTP 400. This mode loads no TensorFlow library, only TF Serving's protos.

    python -m tests.serving_stand_in --model=NAME --base_path=DIR --rest_port=8501 --grpc_port=8500
"""

import argparse
import base64
import http.server
import json
import pathlib
import sys
import threading

import numpy as np

from export import capi

capi.without_tensorflow_runtime()  # as both servers: no TensorFlow Python runtime, TF Serving's protos only

from concurrent import futures  # noqa: E402

import grpc  # noqa: E402
from google.protobuf import json_format  # noqa: E402
from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2  # noqa: E402
from tensorflow.core.protobuf import meta_graph_pb2  # noqa: E402
from tensorflow_serving.apis import get_model_metadata_pb2, predict_pb2, prediction_service_pb2_grpc  # noqa: E402

from export.serving_check import proto_array  # noqa: E402

CODES = {v if v is not object else object: k for k, v in capi.DTYPES.items()}
DT_DOUBLE = 2  # tensorflow.DataType
OPENVINO_FILES = ("*.xml", "*.onnx")  # what OVMS serves from a version folder (an IR's .bin beside its .xml)
OVMS_PRECISIONS = {np.float32: "FP32", np.float64: "FP64", np.float16: "FP16", np.int32: "I32", np.int64: "I64",
                   np.uint8: "U8", np.object_: "STRING"}


class Refused(Exception):
    """A request the server answers with InvalidArgument (gRPC status 3, HTTP 400)."""


def _latest(base_path):
    versions = [int(p.name) for p in pathlib.Path(base_path).iterdir() if p.name.isdigit()]
    if not versions:
        raise SystemExit(f"{base_path} holds no numbered version")
    return pathlib.Path(base_path) / str(max(versions))


class SavedModel:
    """TF Serving's case: the SavedModel through TensorFlow's C++ loader."""

    def __init__(self, version_dir):
        capi.disable_xla_compilation()
        self.session = capi.SavedModelSession(version_dir)

    def input_dtypes(self, signature):
        return {name: capi.DTYPES[info.dtype] for name, info in self.session.signatures[signature].inputs.items()}

    def run(self, signature, inputs):
        try:
            return self.session.run(signature, **inputs)
        except capi.TFError as error:
            raise Refused(error.message) from error

    def metadata(self):
        return {"signature_def": {"signature_def": {k: json_format.MessageToDict(v)
                                                    for k, v in self.session.signatures.items()}}}


def _dims(shape):
    """An OpenVINO shape's dimensions, -1 where any size goes, as OVMS states them."""
    return [d.get_length() if d.is_static else -1 for d in shape]


def _ovms_shape(dims):
    return "(" + ",".join(str(d) for d in dims) + ")"


class OpenVINOModel:
    """OVMS's case: the model compiled by OpenVINO's CPU runtime in float32, its tensor names as the API's names."""

    def __init__(self, path):
        import openvino

        self.compiled = openvino.Core().compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
        self.inputs = {port.get_any_name(): port for port in self.compiled.inputs}

    def input_dtypes(self, signature):  # one signature, whatever the request names
        return {name: port.get_element_type().to_dtype().type for name, port in self.inputs.items()}

    def _check(self, inputs):
        """OVMS's checks of a request against the model, in its order and words."""
        if len(inputs) != len(self.inputs):
            raise Refused(f"Invalid number of inputs - Expected: {len(self.inputs)}; Actual: {len(inputs)}")
        for name, port in self.inputs.items():
            if name not in inputs:
                raise Refused(f"Missing input with specific name - Required input: {name}")
            value, shape, where = inputs[name], port.get_partial_shape(), f"; input name: {name}"
            expected = _dims(shape)
            dtype = port.get_element_type().to_dtype().type
            if value.dtype.type != dtype:
                raise Refused(f"Invalid input precision - Expected: {OVMS_PRECISIONS[dtype]}; "
                              f"Actual: {OVMS_PRECISIONS.get(value.dtype.type, value.dtype.name)}{where}")
            if value.ndim != len(expected):
                raise Refused(f"Invalid number of shape dimensions - Expected: {_ovms_shape(expected)}; "
                              f"Actual: {_ovms_shape(value.shape)}{where}")
            if not shape.compatible(type(shape)(list(value.shape))):
                raise Refused(f"Invalid input shape - Expected: {_ovms_shape(expected)}; "
                              f"Actual: {_ovms_shape(value.shape)}{where}")

    def run(self, signature, inputs):  # OVMS reads no signature_name
        self._check(inputs)
        return {port.get_any_name(): np.array(value) for port, value in self.compiled(inputs).items()}

    def metadata(self):
        """GetModelMetadata's answer, as OVMS builds it: one `serving_default` signature of the model's tensors."""
        signature = meta_graph_pb2.SignatureDef(method_name="tensorflow/serving/predict")
        for ports, infos in ((self.compiled.inputs, signature.inputs), (self.compiled.outputs, signature.outputs)):
            for port in ports:
                info = infos[port.get_any_name()]
                info.name, info.dtype = port.get_any_name(), CODES[port.get_element_type().to_dtype().type]
                info.tensor_shape.dim.extend(tensor_shape_pb2.TensorShapeProto.Dim(size=size)
                                             for size in _dims(port.get_partial_shape()))
        response = get_model_metadata_pb2.GetModelMetadataResponse()
        response.metadata["signature_def"].Pack(get_model_metadata_pb2.SignatureDefMap(
            signature_def={"serving_default": signature}))
        return json_format.MessageToDict(response)["metadata"]


class Server:
    def __init__(self, name, base_path):
        self.name, version = name, _latest(base_path)
        found = [path for pattern in OPENVINO_FILES for path in sorted(version.glob(pattern))]
        self.model = OpenVINOModel(found[0]) if found else SavedModel(version)
        self.lock = threading.Lock()

    def predict(self, signature, inputs):
        with self.lock:  # one session; the servers serialise nothing, but answers are what is checked here
            return self.model.run(signature, inputs)


def _array(proto):
    """A request's TensorProto as numpy: `proto_array`'s dtypes, and float64 (numpy's default), which models refuse."""
    if proto.dtype == DT_DOUBLE:
        return np.frombuffer(proto.tensor_content, np.float64).reshape([d.size for d in proto.tensor_shape.dim])
    return proto_array(proto)


def _message(error):
    return str(error) if isinstance(error, Refused) else f"{type(error).__name__}: {error}"


def _json_value(value):
    if isinstance(value, dict) and set(value) == {"b64"}:
        return base64.b64decode(value["b64"])
    if isinstance(value, list):
        return [_json_value(v) for v in value]
    return value


def _rest_inputs(server, body):
    """The numpy inputs of a row-format request: named instances by their names, others the one input's values."""
    signature = body.get("signature_name", "serving_default")
    dtypes = server.model.input_dtypes(signature)
    rows = [_json_value(row) for row in body["instances"]]
    names = list(rows[0]) if rows and isinstance(rows[0], dict) else list(dtypes)
    columns = {name: [row[name] if isinstance(row, dict) else row for row in rows] for name in names}
    inputs = {}
    for name, values in columns.items():
        dtype = dtypes.get(name)  # a name the model lacks is left for the model to refuse
        if dtype is object:
            array = np.empty(len(values), object)
            array[:] = values
        else:
            array = np.asarray(values, dtype)
        inputs[name] = array
    return signature, inputs


def _rest_outputs(outputs):
    def plain(value):
        return value.astype(str).tolist() if value.dtype == object else value.tolist()

    if len(outputs) == 1:
        return [plain(v) for v in next(iter(outputs.values()))]
    count = len(next(iter(outputs.values())))
    return [{name: plain(value[k]) for name, value in outputs.items()} for k in range(count)]


def rest_handler(server):
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _answer(self, status, payload):
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path != f"/v1/models/{server.name}/metadata":
                return self._answer(404, {"error": f"no route {self.path}"})
            self._answer(200, {"model_spec": {"name": server.name}, "metadata": server.model.metadata()})

        def do_POST(self):
            if self.path != f"/v1/models/{server.name}:predict":
                return self._answer(404, {"error": f"no route {self.path}"})
            try:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                signature, inputs = _rest_inputs(server, body)
                self._answer(200, {"predictions": _rest_outputs(server.predict(signature, inputs))})
            except (Refused, KeyError, ValueError, TypeError) as error:
                self._answer(400, {"error": _message(error)})

    return Handler


def _tensor_proto(value):
    proto = tensor_pb2.TensorProto(dtype=CODES[value.dtype.type if value.dtype != object else object],
                                   tensor_shape=tensor_shape_pb2.TensorShapeProto(
                                       dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=s) for s in value.shape]))
    if value.dtype == object:
        proto.string_val.extend(value.ravel().tolist())
    else:
        proto.tensor_content = np.ascontiguousarray(value).tobytes()
    return proto


class PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
    def __init__(self, server):
        self.server = server

    def Predict(self, request, context):
        if request.model_spec.name != self.server.name:
            context.abort(grpc.StatusCode.NOT_FOUND, f"No model {request.model_spec.name!r} here")
        try:
            inputs = {name: _array(proto) for name, proto in request.inputs.items()}
            outputs = self.server.predict(request.model_spec.signature_name or "serving_default", inputs)
        except (Refused, KeyError, ValueError, TypeError) as error:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, _message(error))
        reply = predict_pb2.PredictResponse()
        for name, value in outputs.items():
            reply.outputs[name].CopyFrom(_tensor_proto(value))
        return reply


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--base_path", required=True)
    parser.add_argument("--rest_port", type=int, required=True)
    parser.add_argument("--grpc_port", type=int, required=True)
    args = parser.parse_args(argv)
    server = Server(args.model, args.base_path)
    rpc = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(PredictionService(server), rpc)
    rpc.add_insecure_port(f"127.0.0.1:{args.grpc_port}")
    rpc.start()
    rest = http.server.ThreadingHTTPServer(("127.0.0.1", args.rest_port), rest_handler(server))
    print("ready", flush=True)
    try:
        rest.serve_forever()
    finally:
        rpc.stop(0)


if __name__ == "__main__":
    sys.exit(main())
