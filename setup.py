"""keras_vit: the Vision Transformer as Keras 3 layers, on TensorFlow, JAX or PyTorch.

Distributed as `keras-vision-transformer` and imported as `keras_vit`: the
PyPI name `keras-vit` belongs to an unrelated, abandoned project (BUILD.md).
"""

import pathlib
import re

from setuptools import find_packages, setup

ROOT = pathlib.Path(__file__).parent
TENSORFLOW = "tensorflow~=2.20.0"
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
    # No Keras backend: the library runs on TensorFlow, JAX or PyTorch, and a user installs the one they use
    # (as with Keras itself); `[tensorflow]` names Keras' default. The trainer and the exporter are TensorFlow
    # programs, so their extras bring it (BUILD.md).
    install_requires=["keras>=3.10", "numpy", "absl-py"],
    extras_require={
        "tensorflow": [TENSORFLOW],
        # The trainer: TFDS input pipelines, Model Garden augmentations and
        # strategies, and the embedded digits dataset from scikit-learn.
        "train": [TENSORFLOW, "tf-models-official~=2.20.0", "tensorflow-datasets", "importlib_resources",
                  "scikit-learn"],
        # Export: the TFLite interpreter for verification, the Serving protos, OpenVINO (its converter writes
        # the IR and its runtime checks it), tf2onnx (writes ONNX) and ONNX Runtime (checks it).
        "export": [TENSORFLOW, "ai-edge-litert", "tensorflow-serving-api~=2.20.0", "openvino>=2025.4",
                   "onnxruntime>=1.20", "tf2onnx>=1.17"],
        # explain's figures; Pillow decodes its image where TensorFlow is not installed.
        "viz": ["matplotlib", "pillow"],
        # Hugging Face hub ids (`ViT.from_checkpoint("google/vit-base-patch16-224")`): its cache, offline-friendly.
        "hub": ["huggingface_hub"],
        # scipy: the official resize (ndimage.zoom) that tests compare against; JAX (CPU): the
        # model and the GPU benchmark on Keras' JAX backend, the lent GPU machines' route;
        # matplotlib: the figures of `python -m keras_vit.explain`; pytest-xdist: the suite runs
        # its test files in two processes (pytest.ini); torch (the CPU build where the index has one):
        # the suite runs keras_vit on all three Keras backends (tests/backends/); huggingface_hub: hub ids
        # are read from a cache the tests populate, offline.
        "test": [TENSORFLOW, "pytest", "pytest-xdist", "scipy", "jax[cpu]==0.10.2", "matplotlib", "torch==2.13.0",
                 "ruff", "huggingface_hub"],  # ruff: tests/test_lint.py runs `ruff check` over the repository
    },
    classifiers=[
        "Programming Language :: Python :: 3",
        "Framework :: Keras",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
