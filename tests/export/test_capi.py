"""export.capi's assumptions about the installed TensorFlow: the symbols it calls through ctypes exist."""

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).parents[2]
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT)}


def test_the_c_api_and_the_one_cxx_symbol_capi_calls_resolve_in_the_installed_tensorflow():
    # export.capi is one of keras_vit's three homes of framework internals: ctypes into TensorFlow's shared
    # libraries, one function by its mangled C++ name (tensorflow::DisableXlaCompilation, which no C API
    # function replaces). When this fails, the installed TensorFlow dropped or renamed one of them; its
    # effect, a jit_compile export refused as TF Serving refuses it, is tests/export/test_saved_model.py's.
    script = ("from export import capi\ncapi.without_tensorflow_runtime()\ncapi.disable_xla_compilation()\n"
              "import sys\nprint(sorted(sys.modules['tensorflow'].__dict__).count('constant'))")
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=ENV, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["0"]  # and TensorFlow's Python runtime never ran: no tf.constant


def test_a_missing_symbol_is_named(monkeypatch):
    import ctypes

    from export import capi

    class Library:  # a TensorFlow whose libraries export nothing
        def __init__(self, *args, **kwargs):
            pass

    monkeypatch.setattr(ctypes, "CDLL", Library)
    try:
        capi._library()
    except RuntimeError as error:
        assert "export no TF_NewStatus, which export.capi calls" in str(error)
    else:
        raise AssertionError("a library without the C API was accepted")
