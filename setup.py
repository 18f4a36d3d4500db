"""keras_vit: the Vision Transformer for TensorFlow and Keras 3.

Distributed as `keras-vision-transformer` and imported as `keras_vit`: the
PyPI name `keras-vit` belongs to an unrelated, abandoned project (BUILD.md).
"""

import pathlib
import re

from setuptools import find_packages, setup

ROOT = pathlib.Path(__file__).parent
VERSION = re.search(r'"(.+)"', (ROOT / "keras_vit" / "_version.py").read_text()).group(1)

setup(
    name="keras-vision-transformer",
    version=VERSION,
    description="The Vision Transformer (ViT) as Keras 3 layers and keras.applications-style builders",
    long_description=(ROOT / "README.md").read_text(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["keras_vit", "keras_vit.*"]),
    package_data={"keras_vit": ["data/*.json"]},
    install_requires=["tensorflow~=2.20.0", "keras>=3.10", "numpy", "absl-py"],
    extras_require={
        # The trainer: TFDS input pipelines, Model Garden augmentations and
        # strategies, and the embedded digits dataset from scikit-learn.
        "train": ["tf-models-official~=2.20.0", "tensorflow-datasets", "importlib_resources", "scikit-learn"],
        # Export: the TFLite interpreter for verification and the Serving protos.
        "export": ["ai-edge-litert", "tensorflow-serving-api~=2.20.0"],
        "viz": ["matplotlib"],
        # scipy: the official resize (ndimage.zoom) that tests compare against; JAX (CPU): the
        # model and the GPU benchmark on Keras' JAX backend, the lent GPU machines' route;
        # matplotlib: the figures of `python -m keras_vit.explain`; pytest-xdist: the suite runs
        # its test files in two processes (pytest.ini).
        "test": ["pytest", "pytest-xdist", "scipy", "jax[cpu]==0.10.2", "matplotlib"],
    },
    classifiers=[
        "Programming Language :: Python :: 3",
        "Framework :: Keras",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
