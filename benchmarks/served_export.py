"""keras_vit's export, written by a child process for the workers that serve it (`served_side`,
`served_openvino_side`, `served_onnxruntime_side`).

The child (`python -m benchmarks.keras_side JSON`) builds the model and runs
the exporter; the worker then holds what a server holds, the export alone,
not a Keras model too. Standard library only: the SavedModel worker must load
nothing before it has set up TensorFlow's C API.
"""

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile


def write(export_format, **arguments):
    """The path of a fresh export (the SavedModel's version directory, the IR's `.xml`, the `.onnx`), removed at
    exit."""
    folder = tempfile.mkdtemp(prefix=f"served-{export_format}-")
    atexit.register(shutil.rmtree, folder, True)
    subprocess.run([sys.executable, "-m", "benchmarks.keras_side",
                    json.dumps({**arguments, "folder": folder, "export_format": export_format})],
                   check=True, stdout=sys.stderr)
    with open(os.path.join(folder, "path.json")) as f:
        return json.load(f)
