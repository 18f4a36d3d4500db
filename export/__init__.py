"""Export keras_vit models: SavedModels for TF Serving, TFLite for devices.

`python -m export --model=PATH --format=saved_model|tflite --output=DIR`;
the same as a Python API in `export.saved_model` and `export.tflite`.

An application beside the library, not part of it: setup.py installs the
`keras_vit` package only, and this one runs from a checkout. It imports
`keras_vit`, never its sibling application `trainers` (tests/test_layout.py).
"""
