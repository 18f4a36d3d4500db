"""Export keras_vit models: SavedModels for TF Serving, TFLite for devices.

`python -m export --model=PATH --format=saved_model|tflite --output=DIR`;
the same as a Python API in `export.saved_model` and `export.tflite`.
"""
