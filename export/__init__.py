"""Export keras_vit models: SavedModels for TF Serving; TFLite, OpenVINO IR and ONNX files for other runtimes.

`python -m export --model=PATH --format=FORMAT --output=DIR`; the same as a
Python API in the format's module (`export.saved_model`, `export.tflite`,
`export.openvino`). Every export is run by the runtime that will serve it and
compared with Keras before its directory appears.

One module per format; what they share (argument checks, the score
comparison, writing a directory whole or not at all) is `export.common`, and
the formats themselves are listed in `export.choices.FORMATS`. Adding a format:

1. write `export/<name>.py`, whose `export_<name>(model, output_dir,
   verify_images, labels=None, metadata=None)` converts the model, runs the
   result in its runtime on the images, refuses it outside its tolerance
   and writes its files under a staging name renamed last (a float file
   format: `common.write_checked` with its converter, its writer and a
   client program for its runtime); and whose `from_command_line(model, request)`
   calls it with a `common.Request` and prints what was checked;
2. add one `Format(...)` line to `choices.FORMATS`: its runtime module and
   the distribution that brings it (added to setup.py's `export` extra), and
   the flags only it takes.

`tests/export/test_formats.py` holds every registered format to that.

An application beside the library, not part of it: setup.py installs the
`keras_vit` package only, and this one runs from a checkout. It imports
`keras_vit`, never its sibling application `trainers` (tests/test_layout.py).
"""
