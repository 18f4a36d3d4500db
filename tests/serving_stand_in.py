"""A stand-in for `tensorflow_model_server`: TF Serving's REST and gRPC front over TensorFlow's C++ loader.

The docs' `curl` and gRPC examples run verbatim against it (tests/test_docs.py). Requests reach the
export through `export.capi.SavedModelSession`, the C++ `LoadSavedModel` and `Session::Run` that TF
Serving runs; only the HTTP and gRPC framing is ours, written to TF Serving's REST API (row format:
`instances`, `{"b64": ...}` for bytes, one `predictions` entry per instance) and its
`PredictionService.Predict`. Bad requests answer InvalidArgument as the server does (HTTP 400).

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

capi.without_tensorflow_runtime()  # as TF Serving: no TensorFlow Python runtime, the C API only
capi.disable_xla_compilation()

from concurrent import futures  # noqa: E402

import grpc  # noqa: E402
from google.protobuf import json_format  # noqa: E402
from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2  # noqa: E402
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc  # noqa: E402

from export.serving_check import proto_array  # noqa: E402

CODES = {v if v is not object else object: k for k, v in capi.DTYPES.items()}


def _latest(base_path):
    versions = [int(p.name) for p in pathlib.Path(base_path).iterdir() if p.name.isdigit()]
    if not versions:
        raise SystemExit(f"{base_path} holds no numbered version")
    return pathlib.Path(base_path) / str(max(versions))


class Server:
    def __init__(self, name, base_path):
        self.name, self.session = name, capi.SavedModelSession(_latest(base_path))
        self.lock = threading.Lock()

    def predict(self, signature, inputs):
        with self.lock:  # one C session; TF Serving serialises nothing, but answers are what is checked here
            return self.session.run(signature, **inputs)

    def input_dtype(self, signature, name):
        return capi.DTYPES[self.session.signatures[signature].inputs[name].dtype]


def _json_value(value):
    if isinstance(value, dict) and set(value) == {"b64"}:
        return base64.b64decode(value["b64"])
    if isinstance(value, list):
        return [_json_value(v) for v in value]
    return value


def _rest_inputs(server, body):
    signature = body.get("signature_name", "serving_default")
    names = list(server.session.signatures[signature].inputs)
    rows = [_json_value(row) for row in body["instances"]]
    columns = {name: [row[name] if isinstance(row, dict) else row for row in rows] for name in names}
    inputs = {}
    for name, values in columns.items():
        dtype = server.input_dtype(signature, name)
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
            signatures = {k: json_format.MessageToDict(v) for k, v in server.session.signatures.items()}
            self._answer(200, {"model_spec": {"name": server.name},
                               "metadata": {"signature_def": {"signature_def": signatures}}})

        def do_POST(self):
            if self.path != f"/v1/models/{server.name}:predict":
                return self._answer(404, {"error": f"no route {self.path}"})
            try:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                signature, inputs = _rest_inputs(server, body)
                self._answer(200, {"predictions": _rest_outputs(server.predict(signature, inputs))})
            except capi.TFError as error:
                self._answer(400, {"error": error.message})
            except (KeyError, ValueError, TypeError) as error:
                self._answer(400, {"error": f"{type(error).__name__}: {error}"})

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
        inputs = {name: proto_array(proto) for name, proto in request.inputs.items()}
        try:
            outputs = self.server.predict(request.model_spec.signature_name or "serving_default", inputs)
        except capi.TFError as error:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, error.message)
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
