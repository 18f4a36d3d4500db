"""The exporter's choices and defaults, in a module that needs no TensorFlow.

`python -m export` defines its flags from these and checks every flag before
TensorFlow loads: a bad command line is refused without paying TensorFlow's import.
"""

QUANTIZATIONS = ("none", "float16", "dynamic", "int8")

# 4096 x 4096: a 12-megapixel phone photo passes; decoding the largest
# accepted image takes 48 MB (8-bit RGB).
DEFAULT_MAX_IMAGE_PIXELS = 4096 * 4096
