"""Input pipelines: any TFDS image dataset, a folder of images, or TFRecords.

The training stream is a pure function of (recipe, start step): epoch `e` is
shuffled with seed (seed, e), and every random augmentation is stateless,
seeded by the example's position in the stream. A run resumed at step `s`
therefore sees exactly the batches an uninterrupted run would see from step
`s` on (Mixup/CutMix/RandAugment/random erasing from Model Garden draw from
stateful generators and are the exception; see BUILD.md).
"""

import dataclasses
import functools
import math
import os
import zlib

import numpy as np
import tensorflow as tf

from keras_vit import image_formats
from keras_vit.preprocessing import preprocess_input, resize_pixels
from trainers import image_scan

AUTOTUNE = tf.data.AUTOTUNE


@dataclasses.dataclass(frozen=True)
class Source:
    """An image-classification split: (uint8 image, int label) examples."""

    dataset: tf.data.Dataset
    num_examples: int
    num_classes: int
    channels: int
    # Files left out by skip_bad_images.
    skipped: int = 0
    # The same examples in the same order as (encoded image bytes, label),
    # where the source has them, else None: the inception-crop training
    # stream decodes these, a JPEG only its crop window.
    encoded: tf.data.Dataset = None
    # Where its examples are stored, as (file or folder, first, end) record
    # ranges: what tells two splits that share examples.
    records: tuple = ()


def check_disjoint(dataset, train_split, train, eval_split, evaluation):
    """Raises ValueError when the evaluation split reads examples the training split reads.

    An accuracy measured on training examples would be overstated silently;
    TFDS slices (`train[:90%]`, `train[90%:]`) are compared by record range.
    """
    for name, first, end in train.records:
        for other, other_first, other_end in evaluation.records:
            if name == other and max(first, other_first) < min(end, other_end):
                shared = "" if math.isinf(min(end, other_end)) else (
                    f", records {max(first, other_first)} to {min(end, other_end) - 1}")
                raise ValueError(
                    f"Splits {train_split!r} and {eval_split!r} of dataset={dataset!r} share examples ({name}"
                    f"{shared}): an accuracy measured on training examples would be overstated. "
                    "Choose an evaluation split that does not overlap the training split.")


def load(name, split, data_dir=None, num_classes=0, skip_bad_images=False):
    """Opens `split` of `name` ("keras_vit_digits", "tfds:X", "folder:P", "tfrecord:G").

    Raises ValueError, before reading any example, for an unknown dataset or
    split, a `num_classes` the dataset's metadata contradicts, TFRecord labels
    outside [0, num_classes) and (unless `skip_bad_images`) folder images that
    cannot be decoded. Labels are checked again as the examples stream.
    """
    kind, _, rest = name.partition(":")
    if name == "keras_vit_digits" or kind == "tfds":
        source = _load_tfds(digits_name() if name == "keras_vit_digits" else rest, split, data_dir)
    elif kind == "folder":
        source = _load_folder(rest, split, skip_bad_images)
    elif kind == "tfrecord":
        source = _load_tfrecord(name, rest, split, num_classes)
    else:
        raise ValueError(
            "`dataset` must be 'keras_vit_digits', 'tfds:NAME', 'folder:PATH' or 'tfrecord:GLOB'; "
            f"received dataset={name!r}")
    if num_classes and num_classes != source.num_classes:
        raise ValueError(f"`num_classes` must match the {source.num_classes} classes dataset={name!r} declares "
                         f"(or be 0 to read them); received num_classes={num_classes}")
    encoded = None if source.encoded is None else check_labels(source.encoded, source.num_classes)
    return dataclasses.replace(source, dataset=check_labels(source.dataset, source.num_classes), encoded=encoded)


def digits_name():
    from trainers import digits  # registers the builder

    return digits.NAME


def _read_config():
    import tensorflow_datasets as tfds

    return tfds.ReadConfig(shuffle_seed=0, interleave_cycle_length=1)


def _check_split(split, splits, dataset, slices=True):
    """Refuses a split that is not one of `splits` nor, where `slices`, a TFDS expression of them (`train[:99%]`)."""
    try:
        if not slices and split not in splits:
            raise KeyError(split)
        splits[split]
    except (KeyError, ValueError):
        also = ", or a TFDS slice of them such as 'train[:99%]'" if slices else ""
        raise ValueError(f"split {split!r} is not one of the splits of dataset {dataset!r}: {sorted(splits)}"
                         f"{also}") from None


def _load_tfds(name, split, data_dir):
    import tensorflow_datasets as tfds

    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError as error:
        # TFDS' own message lists every dataset it knows: pages; the first line names the problem.
        raise ValueError(f"`dataset` names no TFDS dataset: received dataset='tfds:{name}' "
                         f"({str(error).splitlines()[0]} `tfds.list_builders()` lists them)") from None
    if builder.info.splits:  # known before any download for registered datasets
        _check_split(split, builder.info.splits, name)
    builder.download_and_prepare()
    _check_split(split, builder.info.splits, name)
    encoded = builder.as_dataset(split=split, as_supervised=True, shuffle_files=False, read_config=_read_config(),
                                 decoders={"image": tfds.decode.SkipDecoding()})
    info = builder.info
    channels = info.features["image"].shape[-1] or 3
    records = tuple((os.path.realpath(file.filename), file.skip, file.skip + file.take)
                    for file in info.splits[split].file_instructions)
    return Source(_decoded(encoded, channels), info.splits[split].num_examples, info.features["label"].num_classes,
                  channels, encoded=encoded, records=records)


def _load_folder(root, split, skip_bad_images):
    import tensorflow_datasets as tfds

    if not os.path.isdir(root):
        raise ValueError(f"dataset='folder:{root}': no such directory (expected {root}/SPLIT/LABEL/*.jpg)")
    builder = tfds.folder_dataset.ImageFolder(root)
    _check_split(split, builder.info.splits, f"folder:{root}", slices=False)  # a split is a subfolder
    bad = image_scan.scan(root, split)
    if bad and not skip_bad_images:
        listed = "\n".join(f"  {path}: {reason}" for path, reason in list(bad.items())[:20])
        more = f"\n  ... and {len(bad) - 20} more" if len(bad) > 20 else ""
        raise ValueError(f"{len(bad)} of the images of split {split!r} of folder:{root} cannot be decoded:\n"
                         f"{listed}{more}\nFix or remove them, or pass --skip_bad_images to train without them.")
    num_examples = builder.info.splits[split].num_examples
    num_classes = builder.info.features["label"].num_classes
    # The raw bytes and file names, so bad files leave before any decoding.
    ds = builder.as_dataset(split=split, shuffle_files=False, read_config=_read_config(),
                            decoders={"image": tfds.decode.SkipDecoding()})
    if bad:
        bad_paths = tf.constant(sorted(bad))
        ds = ds.filter(lambda ex: tf.logical_not(tf.reduce_any(tf.equal(ex["image/filename"], bad_paths))))
    encoded = ds.map(lambda ex: (ex["image"], ex["label"]))
    return Source(_decoded(encoded, 3), num_examples - len(bad), num_classes, 3, skipped=len(bad), encoded=encoded,
                  records=((os.path.realpath(os.path.join(root, split)), 0, math.inf),))


def _load_tfrecord(name, pattern, split, num_classes):
    if not num_classes:
        raise ValueError(f"TFRecords carry no class count: set --num_classes for dataset={name!r}")
    files = sorted(tf.io.gfile.glob(pattern.replace("{split}", split)))
    if not files:
        raise ValueError(f"No TFRecord files match {pattern.replace('{split}', split)!r} (dataset={name!r})")
    count = sum(_scan_tfrecord_labels(path, num_classes) for path in files)
    encoded = tf.data.TFRecordDataset(files).map(_parse_example, num_parallel_calls=AUTOTUNE, deterministic=True)
    return Source(_decoded(encoded, 3), count, num_classes, 3, encoded=encoded,
                  records=tuple((os.path.realpath(file), 0, math.inf) for file in files))


def _scan_tfrecord_labels(path, num_classes):
    """The number of records in `path`; raises naming the first label outside [0, num_classes)."""
    spec = {"image/class/label": tf.io.FixedLenFeature([], tf.int64)}
    labels = tf.data.TFRecordDataset(path).batch(4096).map(
        lambda records: tf.io.parse_example(records, spec)["image/class/label"])
    count = 0
    for batch in labels.as_numpy_iterator():
        bad = np.flatnonzero((batch < 0) | (batch >= num_classes))
        if bad.size:
            raise ValueError(f"Record {count + bad[0]} of {path} has label {batch[bad[0]]}: labels must be in "
                             f"[0, {num_classes}) for num_classes={num_classes}")
        count += len(batch)
    return count


def check_labels(ds, num_classes):
    """Fails the stream with InvalidArgument naming the label and its record's position in the split."""

    def check(position, example):
        image, label = example
        inside = tf.logical_and(label >= 0, label < num_classes)
        assertion = tf.debugging.Assert(inside, [
            "Label", label, "of record", position, f"is outside [0, {num_classes}) (num_classes={num_classes})"])
        with tf.control_dependencies([assertion]):
            return image, tf.identity(label)

    return ds.enumerate().map(check, num_parallel_calls=AUTOTUNE, deterministic=True)


def _parse_example(record):
    """The Inception/Model Garden convention: image/encoded and image/class/label (still encoded)."""
    features = tf.io.parse_single_example(record, {
        "image/encoded": tf.io.FixedLenFeature([], tf.string),
        "image/class/label": tf.io.FixedLenFeature([], tf.int64),
    })
    return features["image/encoded"], features["image/class/label"]


def _decoded(encoded, channels):
    """(encoded image, label) examples -> (uint8 image, label), in order."""
    return encoded.map(lambda data, label: (image_formats.decode(data, channels), label), num_parallel_calls=AUTOTUNE,
                       deterministic=True)


def _inception_window(shape, seed):
    """(begin, size) of the inception crop (area 5-100%, aspect 3/4-4/3) of an image of `shape`."""
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        shape, tf.zeros([1, 0, 4]), seed=seed, min_object_covered=0.0, aspect_ratio_range=(3 / 4, 4 / 3),
        area_range=(0.05, 1.0), max_attempts=10, use_image_if_no_bounding_boxes=True)
    return begin, size


def _decode_inception_crop(data, seed, channels):
    """The inception crop of an encoded image; a JPEG decodes only the crop (as Model Garden and big_vision do).

    The window is drawn from the header's height and width, so it is the one
    the decoded image would get; libjpeg's cropped decode may round a few
    pixels at the window's edges differently.
    """
    def jpeg():
        begin, size = _inception_window(tf.image.extract_jpeg_shape(data), seed)
        window = tf.stack([begin[0], begin[1], size[0], size[1]])
        return tf.image.decode_and_crop_jpeg(data, window, channels=channels)

    def other():
        image = image_formats.decode(data, channels)
        return tf.slice(image, *_inception_window(tf.shape(image), seed))

    return tf.ensure_shape(tf.cond(tf.io.is_jpeg(data), jpeg, other), [None, None, channels])


def _train_image(image, seed, recipe, encoded_channels=None):
    """A training image from a decoded `image`, or from its bytes when `encoded_channels` is set (inception crop)."""
    size = recipe.model.image_size
    seeds = tf.random.experimental.stateless_split(seed, 4)
    if encoded_channels:
        image = _decode_inception_crop(image, seeds[0], encoded_channels)
    elif recipe.train_crop == "inception":
        image = tf.slice(image, *_inception_window(tf.shape(image), seeds[0]))
    image = tf.image.resize(image, size, method="bilinear")
    if recipe.random_shift:
        pad = recipe.random_shift
        image = tf.pad(image, [[pad, pad], [pad, pad], [0, 0]])
        image = tf.image.stateless_random_crop(image, (*size, tf.shape(image)[-1]), seed=seeds[1])
    if recipe.flip:
        image = tf.image.stateless_random_flip_left_right(image, seed=seeds[2])
    image = tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8)
    if recipe.randaugment_layers:
        from trainers.augment import RandAugment  # Model Garden's, with faster equal ops

        image = RandAugment(
            num_layers=recipe.randaugment_layers, magnitude=recipe.randaugment_magnitude,
            magnitude_std=recipe.randaugment_magnitude_std, exclude_ops=["Cutout"]).distort(image)
    image = preprocess_input(image, config=recipe.model)
    if recipe.random_erasing:
        from official.vision.ops import augment

        image = augment.RandomErasing(probability=recipe.random_erasing).distort(image)
    return image


def eval_image(image, recipe):
    """Resize (short side to size / crop_fraction), centre crop, normalise."""
    image = resize_pixels(image, recipe.model.image_size, recipe.eval_crop_fraction)
    return preprocess_input(image, config=recipe.model)


def train_dataset(recipe, source, global_batch, start_step, num_steps):
    """Steps `[start_step, start_step + num_steps)` of the training stream, in global batches.

    tf.distribute splits each batch over the replicas; the workers of a multi-worker strategy each take
    every n-th batch (`_shard_by_data`).

    Sets TensorFlow's global seed, which pairs with every op's seed: the recipe's for the epochs'
    shuffles, then one of the recipe's seed and `start_step` for the augmentations that draw with
    stateful ops (Model Garden's RandAugment, random erasing and Mixup/CutMix). Under one global seed,
    each chunk of a run replayed the first chunk's draws.
    """
    tf.random.set_seed(recipe.seed)
    # Encoded, where the crop lets JPEGs decode only their window: less decoding and a shuffle buffer of bytes.
    encoded_channels = source.channels if recipe.train_crop == "inception" and source.encoded is not None else None
    examples = source.encoded if encoded_channels else source.dataset
    count = source.num_examples
    start, stop = start_step * global_batch, (start_step + num_steps) * global_batch
    buffer = min(recipe.shuffle_buffer, count)
    # Epoch e is shuffled with its own seed: a Python int, hence the epochs are
    # listed here rather than generated in the graph.
    epochs = [examples.shuffle(buffer, seed=recipe.seed * 1_000_003 + e, reshuffle_each_iteration=False)
              for e in range(start // count, -(-stop // count))]
    stream = functools.reduce(tf.data.Dataset.concatenate, epochs).skip(start % count)
    stream = stream.enumerate(start=start)
    tf.random.set_seed(zlib.crc32(f"{recipe.seed}/{start_step}".encode()))  # before the maps below are traced
    num_classes = source.num_classes

    def prepare(index, example):
        image, label = example
        seed = tf.stack([tf.constant(recipe.seed, tf.int64), index])
        return _train_image(image, seed, recipe, encoded_channels), label

    stream = stream.map(prepare, num_parallel_calls=AUTOTUNE, deterministic=True)
    # Exactly the chunk's batches: Keras runs whole blocks of `steps_per_execution` while data lasts,
    # so a chunk that is no multiple of it would run past its checkpoint or evaluation.
    stream = stream.batch(global_batch, drop_remainder=True).take(num_steps)
    if recipe.mixup_alpha or recipe.cutmix_alpha:
        from trainers.augment import MixupAndCutmix

        mixer = MixupAndCutmix(mixup_alpha=recipe.mixup_alpha, cutmix_alpha=recipe.cutmix_alpha,
                               label_smoothing=recipe.label_smoothing, num_classes=num_classes)
        stream = stream.map(mixer, num_parallel_calls=AUTOTUNE)
    else:
        smoothing = recipe.label_smoothing

        def soft_labels(images, labels):
            onehot = tf.one_hot(labels, num_classes)
            return images, onehot * (1.0 - smoothing) + smoothing / num_classes

        stream = stream.map(soft_labels, num_parallel_calls=AUTOTUNE)
    return _shard_by_data(stream.prefetch(AUTOTUNE))


def _shard_by_data(ds):
    # Workers of a multi-worker strategy take every n-th global batch of the
    # same deterministic stream (tf.distribute splits each batch over replicas).
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return ds.with_options(options)


def eval_dataset(recipe, source, global_batch):
    """The evaluation split, in order, with one-hot labels, in global batches."""
    ds = source.dataset.map(lambda image, label: (eval_image(image, recipe), tf.one_hot(label, source.num_classes)),
                num_parallel_calls=AUTOTUNE, deterministic=True)
    return _shard_by_data(ds.batch(global_batch).prefetch(AUTOTUNE))
