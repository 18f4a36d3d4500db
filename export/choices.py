"""The exporter's formats, choices and defaults, in a module that needs no TensorFlow.

`python -m export` defines its flags from these and checks every flag (and
that the format's runtime is installed) before TensorFlow loads: a bad
command line is refused without paying TensorFlow's import.
"""

import dataclasses
import importlib.util

QUANTIZATIONS = ("none", "float16", "dynamic", "int8")

# 4096 x 4096: a 12-megapixel phone photo passes; decoding the largest
# accepted image takes 48 MB (8-bit RGB).
DEFAULT_MAX_IMAGE_PIXELS = 4096 * 4096


@dataclasses.dataclass(frozen=True)
class Format:
    """One `--format`: its module `export.<name>` holds `from_command_line(model, request)`.

    `needs`: (module, distribution) pairs of the `export` extra it imports (its runtime first); `flags`, the
    flags only it takes; `images`, whether it is checked on decoded `--images` (a file format taking the scaled
    pixels) rather than on requests (the SavedModel).
    """

    name: str
    needs: tuple
    flags: tuple = ()
    images: bool = True


FORMATS = {f.name: f for f in (
    Format("saved_model", (("tensorflow_serving", "tensorflow-serving-api"),),
           ("name", "version", "top_k", "max_image_pixels", "jit_compile", "overwrite"), images=False),
    Format("tflite", (("ai_edge_litert", "ai-edge-litert"),), ("quantize", "images", "calibration_images", "force")),
    Format("openvino", (("openvino", "openvino"),), ("images",)),
    Format("onnx", (("onnxruntime", "onnxruntime"), ("tf2onnx", "tf2onnx")), ("images",)),
)}
INSTALL = "pip install 'keras-vision-transformer[export]' (in a checkout: pip install -e '.[export]')"


def missing_message(export_format):
    """None when `export_format` can be written here; else one line saying what to install."""
    missing = [distribution for module, distribution in FORMATS[export_format].needs
               if importlib.util.find_spec(module) is None]
    if not missing:
        return None
    return f"--format={export_format} needs {' and '.join(missing)}, from the 'export' extra: {INSTALL}"
