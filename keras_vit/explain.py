"""`python -m keras_vit.explain --model=PATH --image=FILE [--output=DIR]`: a ViT's analyses as figures.

Writes four PNG files (matplotlib: `pip install 'keras-vision-transformer[viz]'`, in a checkout
`pip install -e '.[viz]'`):
- `rollout.png`: the image, its attention rollout overlaid (Abnar & Zuidema
  2020; the paper's Figure 6) and the top-5 classes;
- `attention_distance.png`: the mean attention distance of every head of
  every block (the paper's Figure 7, right);
- `position_similarity.png`: each patch's position-embedding similarity
  with every other (Figure 7, centre), for learned position tables;
- `embedding_filters.png`: the principal components of the patch-embedding
  filters (Figure 7, left).
`--model` is a `.keras` file of keras_vit or any checkpoint it reads; the
image is decoded, resized and normalised as the model's `vit_config` says.
"""

import os
import pathlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags  # noqa: E402

_MODEL = flags.DEFINE_string("model", None, "A keras_vit .keras file, or a checkpoint (.npz, .safetensors, "
                                            "Hugging Face directory).")
_IMAGE = flags.DEFINE_string("image", None, "A JPEG, PNG, GIF, BMP or still WebP image.")
_OUTPUT = flags.DEFINE_string("output", None, "Directory for the figures (default: explain_<image name>).")
_LABELS = flags.DEFINE_string("labels", None, "Class names, one per line (default: ImageNet's for 1000 "
                                              "classes, else class numbers).")
_HEAD_FUSION = flags.DEFINE_enum("head_fusion", "mean", ["mean", "max", "min"], "How rollout fuses heads.")
_CROP = flags.DEFINE_float("crop_fraction", 1.0, "Centre crop of the image before resizing (1.0: none).")
flags.register_validator("crop_fraction", lambda v: 0.0 < v <= 1.0, "--crop_fraction must be in (0, 1]")


def read_image(path, config, crop_fraction):
    """`(pixels, inputs)`: the image at the model's size as uint8 for display, and normalised for the model."""
    import keras
    import numpy as np

    import keras_vit
    from keras_vit import image_formats

    data = pathlib.Path(path).read_bytes()
    problem = image_formats.header_problem(data[:image_formats.HEADER_BYTES])
    if problem:
        raise ValueError(f"--image={path!r} is {problem}: save it as a still WebP, PNG or JPEG")
    tf = image_formats.tf
    if tf is None:  # TensorFlow absent: Pillow decodes, keras.ops resizes
        try:
            image = image_formats.decode_with_pillow(data, config.channels)
        except ValueError as error:
            raise ValueError(f"--image={path!r}: {error}") from error
    else:  # as the trainer and the exported model decode
        try:
            image = image_formats.decode(data, config.channels)
        except tf.errors.InvalidArgumentError as error:
            name = image_formats.NAMES[image_formats.format_of_bytes(data)]
            raise ValueError(f"--image={path!r} is a damaged {name} image: {error.message}") from error
    resized = keras_vit.resize_and_center_crop(image, config.image_size, crop_fraction)
    resized = resized.numpy() if tf is not None and tf.is_tensor(resized) else keras.ops.convert_to_numpy(resized)
    pixels = np.clip(np.round(resized), 0, 255).astype(np.uint8)
    return pixels, keras_vit.preprocess_input(pixels[None], config=config)


def class_names(model, labels_path):
    """The names of the model's classes, or None for a model without a head."""
    classes = model.vit_config.classes
    if not classes:
        return None
    if labels_path:
        names = pathlib.Path(labels_path).read_text().splitlines()
        if len(names) != classes:
            raise ValueError(f"--labels={labels_path!r} has {len(names)} names; the model has {classes} classes")
        return names
    if classes == 1000:
        from keras_vit.imagenet import class_index

        return [name for _, name in class_index()]
    return [f"class {i}" for i in range(classes)]


def check_paths(model, image, labels, output):
    """The figures' directory, once the flags name a model, an image and labels that exist, and no file as it."""
    for name, value in (("model", model), ("image", image)):
        if not value:
            raise ValueError(f"--{name} is required")
    for name, value in (("image", image), ("labels", labels)):
        if value and not os.path.isfile(value):
            raise ValueError(f"--{name}={value!r}: no such file")
    output = pathlib.Path(output or f"explain_{pathlib.Path(image).stem}")
    if output.exists() and not output.is_dir():
        raise ValueError(f"--output must be a directory for the figures; received --output={str(output)!r}, "
                         "an existing file")
    return output


def top5(model, inputs, names):
    """`[(name, probability), ...]` of the five best classes (fewer if the model has fewer)."""
    import numpy as np

    from keras_vit.model import outputs_probabilities

    scores = np.asarray(model.predict_on_batch(inputs))[0]
    if not outputs_probabilities(model):  # a distilled DeiT's softmax sits in its heads
        scores = np.exp(scores - scores.max()) / np.exp(scores - scores.max()).sum()
    best = np.argsort(scores)[::-1][:5]
    return [(names[i], float(scores[i])) for i in best]


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    try:
        output = check_paths(_MODEL.value, _IMAGE.value, _LABELS.value, _OUTPUT.value)
    except ValueError as error:
        raise app.UsageError(str(error)) from error
    from keras_vit import figures
    from keras_vit.saving import load_model

    try:
        model = load_model(_MODEL.value)
        names = class_names(model, _LABELS.value)
        pixels, inputs = read_image(_IMAGE.value, model.vit_config, _CROP.value)
        predictions = top5(model, inputs, names) if names else None
        written = figures.write_all(model, pixels, inputs, predictions, output, _HEAD_FUSION.value)
    except ValueError as error:
        raise app.UsageError(str(error)) from error
    for path, what in written:
        print(f"{path}: {what}")
    return 0


if __name__ == "__main__":
    app.run(main)
