"""The keras_vit trainer: `python -m trainers.train --recipe=NAME --model_dir=DIR`.

An application beside the library, not part of it: setup.py installs the
`keras_vit` package only, and this one runs from a checkout. It imports
`keras_vit`, never its sibling application `export` (tests/test_layout.py).
"""
