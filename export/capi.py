"""A SavedModel loaded and run the way TF Serving does it: TensorFlow's C API.

TF Serving loads a version with the C++ `LoadSavedModel`: it imports the
MetaGraph, restores the variables through the SavedModel's saver, runs the
init op, and answers each request with `Session::Run` on the signature's
tensor names. Python's `tf.saved_model.load` takes another road (it rebuilds
the object graph), so an export it loads can still fail in TF Serving. The C
API in the tensorflow wheel (`TF_LoadSessionFromSavedModel`, `TF_SessionRun`)
is that C++ loader; this module drives it through ctypes, with no Python
TensorFlow code on the path from the files to the outputs.

It is one of the three modules that use framework internals (BUILD.md): the
C API's functions through ctypes, and one C++ function by its mangled name,
`tensorflow::DisableXlaCompilation()`, which TF Serving calls at start and
which the C API does not offer (its XLA switches, `TF_EnableXLACompilation`
and the like, set auto-clustering, not this refusal). tests/export/test_capi.py
fails, naming the symbol, when the installed TensorFlow drops one of them.
"""

import ctypes
import importlib.util
import pathlib
import sys

import numpy as np

# TF_DataType codes (tensorflow/c/tf_datatype.h; the DataType enum's values) of the dtypes an export uses.
DTYPES = {1: np.float32, 3: np.int32, 4: np.uint8, 7: object, 9: np.int64}
_CODES = {np.dtype(v) if v is not object else object: k for k, v in DTYPES.items()}
_TSTRING_BYTES = 24  # sizeof(TF_TString)
# TF_Code values (tensorflow/c/tf_status.h), for messages.
CODE_NAMES = {0: "OK", 3: "INVALID_ARGUMENT", 5: "NOT_FOUND", 9: "FAILED_PRECONDITION", 13: "INTERNAL"}


class TFError(RuntimeError):
    """A non-OK TF_Status: `code` is its TF_Code (3 is InvalidArgument)."""

    def __init__(self, code, message):
        super().__init__(f"{CODE_NAMES.get(code, code)}: {message}")
        self.code = code
        self.message = message


class _Buffer(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("length", ctypes.c_size_t), ("deallocator", ctypes.c_void_p)]


class _Output(ctypes.Structure):
    _fields_ = [("oper", ctypes.c_void_p), ("index", ctypes.c_int)]


def _library():
    """The C API of the installed tensorflow wheel, with its function types declared."""
    # OpenSSL first: loaded after TensorFlow's libraries (global symbols, BoringSSL among them), Python's
    # hashlib and ssl crash the process on import (numpy.random imports them, for one).
    import hashlib  # noqa: F401
    import ssl  # noqa: F401

    directory = pathlib.Path(importlib.util.find_spec("tensorflow").origin).parent
    libraries = [ctypes.CDLL(str(directory / name), mode=ctypes.RTLD_GLOBAL)
                 for name in ("libtensorflow_framework.so.2", "libtensorflow_cc.so.2")]
    p, i, size = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
    signatures = {  # name: (result, arguments)
        "TF_NewStatus": (p, []), "TF_DeleteStatus": (None, [p]), "TF_GetCode": (i, [p]),
        "TF_Message": (ctypes.c_char_p, [p]), "TF_NewGraph": (p, []), "TF_DeleteGraph": (None, [p]),
        "TF_NewSessionOptions": (p, []), "TF_DeleteSessionOptions": (None, [p]),
        "TF_SetConfig": (None, [p, p, size, p]),
        "TF_NewBuffer": (ctypes.POINTER(_Buffer), []), "TF_DeleteBuffer": (None, [p]),
        "TF_LoadSessionFromSavedModel": (p, [p, p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p), i, p, p, p]),
        "TF_GraphOperationByName": (p, [p, ctypes.c_char_p]),
        "TF_SessionRun": (None, [p, p, p, p, i, p, p, i, p, i, p, p]),
        "TF_CloseSession": (None, [p, p]), "TF_DeleteSession": (None, [p, p]),
        "TF_AllocateTensor": (p, [i, ctypes.POINTER(ctypes.c_int64), i, size]),
        "TF_DeleteTensor": (None, [p]), "TF_TensorData": (p, [p]), "TF_TensorType": (i, [p]),
        "TF_NumDims": (i, [p]), "TF_Dim": (ctypes.c_int64, [p, i]), "TF_TensorByteSize": (size, [p]),
        "TF_StringInit": (None, [p]), "TF_StringCopy": (None, [p, ctypes.c_char_p, size]),
        "TF_StringGetDataPointer": (p, [p]), "TF_StringGetSize": (size, [p]),
        # C++ `tensorflow::DisableXlaCompilation()`, which TF Serving calls at start (below).
        "_ZN10tensorflow21DisableXlaCompilationEv": (None, []),
    }
    api = {}
    for name, (result, arguments) in signatures.items():
        function = next((getattr(lib, name) for lib in libraries if hasattr(lib, name)), None)
        if function is None:
            raise RuntimeError(f"The installed TensorFlow's libraries ({directory}) export no {name}, which "
                               "export.capi calls: this TensorFlow changed its C API or its C++ symbols")
        function.restype, function.argtypes = result, arguments
        api[name] = function
    return api


_API = None


def _api():
    global _API
    if _API is None:
        _API = _library()
    return _API


def without_tensorflow_runtime():
    """Lets this process import TensorFlow's protocol buffers without TensorFlow's Python runtime.

    After it, `import tensorflow` gives the package unexecuted: `tensorflow.core.*_pb2` and
    `tensorflow_serving.apis` import, `tf.*` does not exist, and this module's C API is the only
    TensorFlow code that runs. That is TF Serving's case (a C++ binary), and it spares a fresh
    process TensorFlow's Python start-up, most of an export check's time. Call it first.
    """
    if "tensorflow" in sys.modules:
        raise RuntimeError("without_tensorflow_runtime() must run before anything imports tensorflow")
    spec = importlib.util.find_spec("tensorflow")
    sys.modules["tensorflow"] = importlib.util.module_from_spec(spec)  # its __path__, not its __init__


def disable_xla_compilation():
    """Turns XLA compilation off in this process for good, as TF Serving does at start.

    `tensorflow_model_server` calls `tensorflow::DisableXlaCompilation()` unless
    it is started with `--xla_cpu_compilation_enabled=true`; a request that
    reaches an XLA cluster (`jit_compile=True`) then fails instead of compiling.
    """
    import tensorflow  # noqa: F401  (importing it after this call crashes: its start-up sets XLA's flags)
    # (after `without_tensorflow_runtime`, that import runs nothing, and no start-up ever comes)

    _api()["_ZN10tensorflow21DisableXlaCompilationEv"]()


def _check(status):
    api = _api()
    code = api["TF_GetCode"](status)
    if code:
        raise TFError(code, api["TF_Message"](status).decode(errors="replace"))


def _to_tensor(array):
    """A numpy array (numeric, or bytes objects for strings) as a new TF_Tensor."""
    api = _api()
    strings = array.dtype == object or array.dtype.kind == "S"
    code = _CODES[object] if strings else _CODES.get(array.dtype)
    if code is None:
        raise TypeError(f"Unsupported input dtype {array.dtype}; expected one of float32, int32, uint8, int64, bytes")
    dims = (ctypes.c_int64 * array.ndim)(*array.shape)
    nbytes = array.size * _TSTRING_BYTES if strings else array.nbytes
    tensor = api["TF_AllocateTensor"](code, dims, array.ndim, nbytes)
    data = api["TF_TensorData"](tensor)
    if strings:
        for k, value in enumerate(array.reshape(-1)):
            element = data + k * _TSTRING_BYTES
            api["TF_StringInit"](element)
            api["TF_StringCopy"](element, bytes(value), len(value))
    else:
        ctypes.memmove(data, np.ascontiguousarray(array).ctypes.data, nbytes)
    return tensor


def _from_tensor(tensor):
    """A TF_Tensor's contents as a numpy array (bytes objects for strings)."""
    api = _api()
    shape = tuple(api["TF_Dim"](tensor, d) for d in range(api["TF_NumDims"](tensor)))
    dtype = DTYPES.get(api["TF_TensorType"](tensor))
    if dtype is None:
        raise TypeError(f"Unsupported output TF_DataType {api['TF_TensorType'](tensor)}")
    data = api["TF_TensorData"](tensor)
    if dtype is object:
        count = int(np.prod(shape))
        values = [ctypes.string_at(api["TF_StringGetDataPointer"](data + k * _TSTRING_BYTES),
                                   api["TF_StringGetSize"](data + k * _TSTRING_BYTES)) for k in range(count)]
        result = np.empty(count, object)
        result[:] = values
        return result.reshape(shape)
    return np.frombuffer(ctypes.string_at(data, api["TF_TensorByteSize"](tensor)), dtype).reshape(shape).copy()


class SavedModelSession:
    """A SavedModel loaded by `TF_LoadSessionFromSavedModel`, run by `TF_SessionRun`.

    Example:
    >>> session = SavedModelSession("serving/vit/1")        # doctest: +SKIP
    >>> session.run("serving_default", images=np.array([jpeg_bytes], object))  # doctest: +SKIP
    {'probabilities': array(...), 'top_k_classes': ..., ...}
    """

    def __init__(self, export_dir, tags=("serve",), threads=None):
        """`threads`: the threads each op may use (TF Serving's `--tensorflow_intra_op_parallelism`); default
        TensorFlow's, every core."""
        from tensorflow.core.protobuf import config_pb2, meta_graph_pb2  # the protos only; loading is C++

        api = _api()
        status, options, self._graph = api["TF_NewStatus"](), api["TF_NewSessionOptions"](), api["TF_NewGraph"]()
        meta_graph = api["TF_NewBuffer"]()
        tag_array = (ctypes.c_char_p * len(tags))(*[t.encode() for t in tags])
        try:
            if threads:
                config = config_pb2.ConfigProto(intra_op_parallelism_threads=threads).SerializeToString()
                api["TF_SetConfig"](options, config, len(config), status)
                _check(status)
            self._session = api["TF_LoadSessionFromSavedModel"](
                options, None, str(export_dir).encode(), tag_array, len(tags), self._graph, meta_graph, status)
            _check(status)
            buffer = meta_graph.contents
            self.meta_graph = meta_graph_pb2.MetaGraphDef.FromString(ctypes.string_at(buffer.data, buffer.length))
        finally:
            api["TF_DeleteBuffer"](meta_graph)
            api["TF_DeleteSessionOptions"](options)
            api["TF_DeleteStatus"](status)
        self.signatures = self.meta_graph.signature_def

    def _output(self, tensor_name):
        operation, _, index = tensor_name.partition(":")
        handle = _api()["TF_GraphOperationByName"](self._graph, operation.encode())
        if not handle:
            raise TFError(5, f"The graph has no operation {operation!r}")
        return _Output(handle, int(index or 0))

    def run(self, signature_name, **inputs):
        """Runs one signature on numpy inputs; returns its outputs by name."""
        if signature_name not in self.signatures:
            raise KeyError(f"No signature {signature_name!r}; the export has {sorted(self.signatures)}")
        signature = self.signatures[signature_name]
        if set(inputs) != set(signature.inputs):
            raise KeyError(f"Signature {signature_name!r} takes inputs {sorted(signature.inputs)}; "
                           f"received {sorted(inputs)}")
        api = _api()
        names, outputs = list(inputs), list(signature.outputs)
        feeds = (_Output * len(names))(*[self._output(signature.inputs[n].name) for n in names])
        values = (ctypes.c_void_p * len(names))(*[_to_tensor(np.asarray(inputs[n])) for n in names])
        fetches = (_Output * len(outputs))(*[self._output(signature.outputs[n].name) for n in outputs])
        results = (ctypes.c_void_p * len(outputs))()
        status = api["TF_NewStatus"]()
        try:
            api["TF_SessionRun"](self._session, None, feeds, values, len(names), fetches, results, len(outputs),
                                 None, 0, None, status)
            _check(status)
            return {name: _from_tensor(results[k]) for k, name in enumerate(outputs)}
        finally:
            for tensor in (*values, *results):
                if tensor:
                    api["TF_DeleteTensor"](tensor)
            api["TF_DeleteStatus"](status)

    def close(self):
        api = _api()
        status = api["TF_NewStatus"]()
        api["TF_CloseSession"](self._session, status)
        api["TF_DeleteSession"](self._session, status)
        api["TF_DeleteGraph"](self._graph)
        api["TF_DeleteStatus"](status)


def describe(tensor_infos):
    """{name: "dtype(shape)"} of a signature's inputs or outputs, e.g. {'images': 'string(None,)'}."""
    import tensorflow as tf

    def text(info):
        if info.tensor_shape.unknown_rank:
            return f"{tf.dtypes.as_dtype(info.dtype).name}(any shape)"
        dims = tuple(None if d.size < 0 else d.size for d in info.tensor_shape.dim)
        return f"{tf.dtypes.as_dtype(info.dtype).name}{dims}"

    return {name: text(info) for name, info in sorted(tensor_infos.items())}
