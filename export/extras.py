"""The exporter's optional dependencies, the `export` extra: checked before any work, named when missing."""

import importlib.util

# format -> (module imported, distribution that provides it)
NEEDS = {"saved_model": ("tensorflow_serving", "tensorflow-serving-api"),
         "tflite": ("ai_edge_litert", "ai-edge-litert"),
         "openvino": ("openvino", "openvino")}
INSTALL = "pip install 'keras-vision-transformer[export]' (in a checkout: pip install -e '.[export]')"


def missing_message(export_format):
    """None when `export_format` can be written here; else one line saying what to install."""
    module, distribution = NEEDS[export_format]
    if importlib.util.find_spec(module) is not None:
        return None
    return f"--format={export_format} needs {distribution}, which comes with the 'export' extra: {INSTALL}"
