"""Input pipelines: any TFDS image dataset, a folder of images, or TFRecords.

The training stream is a pure function of (recipe, start step): epoch `e` is
shuffled with seed (seed, e), and every random augmentation is stateless,
seeded by the example's position in the stream. A run resumed at step `s`
therefore sees exactly the batches an uninterrupted run would see from step
`s` on (Mixup/CutMix/RandAugment/random erasing from Model Garden draw from
stateful generators and are the exception; see BUILD.md).
"""

import contextlib
import dataclasses
import functools
import io
import math
import os
import sys
import zlib

import numpy as np
import tensorflow as tf

from keras_vit import image_formats
from keras_vit.preprocessing import preprocess_input, resize_pixels
from trainers import folders, image_ends, image_scan, jpeg_check

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
    # `encoded` with each example's name (its file, or its record and file)
    # as a third element: what names an image that fails to decode mid-run.
    named: tf.data.Dataset = None
    # Whether an image that fails to decode mid-run is left out (logged) or stops the run, named.
    skip_bad_images: bool = False
    # Where its examples are stored, as (file or folder, first, end) record
    # ranges: what tells two splits that share examples.
    records: tuple = ()
    # A folder's images as listed (`folders.Files`, skipped ones included: its hold-out is decided on them),
    # and {path: reason} of those left out.
    files: object = None
    bad: dict = dataclasses.field(default_factory=dict)
    # The name of each class, in label order, where the dataset has them (a folder's LABEL folders, TFDS' names).
    class_names: tuple = None


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
    outside [0, num_classes), a folder in another layout or of one class, and
    (unless `skip_bad_images`, which leaves them out and counts them in
    `Source.skipped`) folder images and TFRecord records that cannot be decoded,
    cut ones included. Labels are checked again as the examples stream.
    """
    kind, _, rest = name.partition(":")
    if name == "keras_vit_digits" or kind == "tfds":
        source = _load_tfds(digits_name() if name == "keras_vit_digits" else rest, split, data_dir)
    elif kind == "folder":
        source = _load_folder(rest, split, skip_bad_images)
    elif kind == "tfrecord":
        source = _load_tfrecord(name, rest, split, num_classes, skip_bad_images)
    else:
        raise ValueError(
            "`dataset` must be 'keras_vit_digits', 'tfds:NAME', 'folder:PATH' or 'tfrecord:GLOB'; "
            f"received dataset={name!r}")
    if num_classes and num_classes != source.num_classes:
        raise ValueError(f"`num_classes` must match the {source.num_classes} classes dataset={name!r} declares "
                         f"(or be 0 to read them); received num_classes={num_classes}")
    return _with_streams(dataclasses.replace(source, named=check_labels(source.named, source.num_classes)),
                         skip_bad_images)


def _with_streams(source, skip_bad_images):
    """`source` with its decoded and encoded streams, both from its named one: the same examples in one order."""
    named = source.named
    decoded = _decoded(named, source.channels, skip_bad_images)
    if not skip_bad_images:  # known, Keras reads no more than it (else it warns "ran out of data")
        decoded = decoded.apply(tf.data.experimental.assert_cardinality(source.num_examples))
    return dataclasses.replace(source, dataset=decoded, encoded=named.map(lambda data, label, _: (data, label)),
                               skip_bad_images=skip_bad_images)


def digits_name():
    from trainers import digits  # registers the builder

    return digits.NAME


def _read_config():
    import tensorflow_datasets as tfds

    return tfds.ReadConfig(shuffle_seed=0, interleave_cycle_length=1)


def _check_split(split, splits, dataset):
    """Refuses a split that is neither one of `splits` nor a TFDS expression of them (`train[:99%]`)."""
    try:
        splits[split]
    except (KeyError, ValueError):
        raise ValueError(f"split {split!r} is not one of the splits of dataset {dataset!r}: {sorted(splits)}, or a "
                         "TFDS slice of them such as 'train[:99%]'") from None


@contextlib.contextmanager
def _absl_quiet():
    """absl's WARNING lines off for a moment (TFDS logs through absl)."""
    from absl import logging

    verbosity = logging.get_verbosity()
    logging.set_verbosity(logging.ERROR)
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)


def _prepare(builder, name):
    """Prepares a TFDS dataset, or says which one is not at hand and how to prepare it (not TFDS' traceback)."""
    if builder.is_prepared():
        return
    manual = getattr(builder, "MANUAL_DOWNLOAD_INSTRUCTIONS", None)
    how = (f"put its files in {os.path.join(builder.data_dir_root, 'downloads', 'manual')} "
           f"as TFDS' page for {name} says, then run again" if manual else
           f"run `tfds build {name} --data_dir={builder.data_dir_root}` where there is network access, or copy a "
           f"prepared {name}/ folder into {builder.data_dir_root}")
    try:
        if name == digits_name():  # it ships in the package: TFDS' "Downloading ... Unknown size" lines would mislead
            print(f"Preparing the embedded digits dataset in {builder.data_dir_root} (once)", file=sys.stderr)
            with contextlib.redirect_stdout(io.StringIO()):
                builder.download_and_prepare()
        else:
            builder.download_and_prepare()
    except Exception as error:  # TFDS raises AssertionError, DownloadError, OSError...: all mean "not at hand"
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ValueError(f"The dataset tfds:{name} is not prepared in {builder.data_dir_root} and could not be "
                         f"prepared here ({type(error).__name__}: {first}). To prepare it, {how}") from None


def _load_tfds(name, split, data_dir):
    with _absl_quiet():  # an unprepared dataset's folder draws "Variant folder ... has no dataset_info.json"
        return _open_tfds(name, split, data_dir)


def _open_tfds(name, split, data_dir):
    import tensorflow_datasets as tfds

    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError as error:
        # TFDS' own message lists every dataset it knows: pages; the first line names the problem.
        raise ValueError(f"`dataset` names no TFDS dataset: received dataset='tfds:{name}' "
                         f"({str(error).splitlines()[0]} `tfds.list_builders()` lists them)") from None
    if builder.info.splits:  # known before any download for registered datasets
        _check_split(split, builder.info.splits, name)
    _prepare(builder, name)
    _check_split(split, builder.info.splits, name)
    encoded = builder.as_dataset(split=split, as_supervised=True, shuffle_files=False, read_config=_read_config(),
                                 decoders={"image": tfds.decode.SkipDecoding()})
    info = builder.info
    channels = info.features["image"].shape[-1] or 3
    records = tuple((os.path.realpath(file.filename), file.skip, file.skip + file.take)
                    for file in info.splits[split].file_instructions)
    named = encoded.enumerate().map(lambda position, example: (*example, tf.strings.join(
        ["record ", tf.strings.as_string(position), f" of split {split!r} of tfds:{name}"])))
    return Source(None, info.splits[split].num_examples, info.features["label"].num_classes, channels,
                  named=named, records=records, class_names=tuple(info.features["label"].names))


def _load_folder(root, split, skip_bad_images):
    problem = folders.layout_problem(root)
    if problem:
        raise ValueError(problem)
    files = folders.list_split(root, split)
    if len(files.classes) < 2:
        raise ValueError(f"dataset='folder:{root}' has one class ({files.classes[0]!r} in {root}/{split}): a "
                         f"classifier needs at least 2 (top-1 would be 1.0 whatever it learns); expected "
                         f"{folders.layout(root)}")
    if not files.paths:
        raise ValueError(f"dataset='folder:{root}' split {split!r} holds no images; expected {folders.layout(root)}")
    bad = _folder_problems(files.paths)
    if bad and not skip_bad_images:
        raise ValueError(_bad_images_message(bad, f"of split {split!r} of folder:{root}"))
    return _folder_source(files, bad)


def _folder_problems(paths):
    """`{path: reason}` for the images that cannot be decoded whole: by header, by their ends, then (JPEGs) by a
    decode that counts libjpeg's corrupt-data warnings (`jpeg_check`)."""
    bad = {path: reason for path in paths for reason in [image_scan.problem(path)] if reason}
    # Cut files pass the header scan; their ends find them (`image_ends`).
    bad.update((path, reason) for path in paths if path not in bad
               for reason in [image_ends.file_problem(path)] if reason)
    # A JPEG cut short and closed again decodes half grey with only libjpeg's anonymous warning: decoded once here.
    bad.update(jpeg_check.corrupt_jpegs([path for path in paths if path not in bad]))
    return dict(sorted(bad.items()))


def _folder_source(files, bad):
    """A Source of `files` less the `bad` ones, read in their listed order; `files` and `bad` are kept in it."""
    kept = files.keep(lambda path: path not in bad)
    paths, labels = tf.constant(kept.paths, tf.string, [len(kept)]), tf.constant(kept.labels, tf.int64, [len(kept)])
    named = tf.data.Dataset.from_tensor_slices((paths, labels)).map(
        lambda path, label: (tf.io.read_file(path), label, path), num_parallel_calls=AUTOTUNE, deterministic=True)
    return Source(None, len(kept), len(files.classes), 3, skipped=len(files) - len(kept), named=named,
                  records=files.ranges, files=files, bad=bad, class_names=files.classes)


def _bad_images_message(bad, where):
    listed = "\n".join(f"  {name}: {reason}" for name, reason in list(bad.items())[:20])
    more = f"\n  ... and {len(bad) - 20} more" if len(bad) > 20 else ""
    return (f"{len(bad)} of the images {where} cannot be decoded:\n{listed}{more}\n"
            "Fix or remove them, or pass --skip_bad_images to train without them.")


def _load_tfrecord(name, pattern, split, num_classes, skip_bad_images=False):
    if not num_classes:
        raise ValueError(f"TFRecords carry no class count: set --num_classes for dataset={name!r}")
    files = sorted(tf.io.gfile.glob(pattern.replace("{split}", split)))
    if not files:
        raise ValueError(f"No TFRecord files match {pattern.replace('{split}', split)!r} (dataset={name!r})")
    counts, bad, skip = [], {}, []
    for path in files:
        count, cut = _scan_tfrecord(path, num_classes)
        bad.update((f"record {record} of {path}", reason) for record, reason in cut.items())
        skip.extend(sum(counts) + record for record in cut)
        counts.append(count)
    if bad and not skip_bad_images:
        raise ValueError(_bad_images_message(bad, f"of split {split!r} of {name}"))
    records = tf.data.Dataset.from_tensor_slices(files).flat_map(_named_records)  # TFRecordDataset(files)'s order
    if skip:  # by position in the split, before any decoding
        positions = tf.constant(skip, tf.int64)
        records = records.enumerate().filter(
            lambda position, _: tf.logical_not(tf.reduce_any(tf.equal(position, positions)))).map(lambda _, r: r)
    named = records.map(lambda record, where: (*_parse_example(record), where), num_parallel_calls=AUTOTUNE,
                        deterministic=True)
    return Source(None, sum(counts) - len(skip), num_classes, 3, skipped=len(skip), named=named,
                  records=tuple((os.path.realpath(file), 0, math.inf) for file in files))


def _named_records(path):
    """(record, "record K of PATH") of one TFRecord file."""
    return tf.data.TFRecordDataset(path).enumerate().map(
        lambda k, record: (record, tf.strings.join(["record ", tf.strings.as_string(k), " of ", path])))


def _scan_tfrecord(path, num_classes):
    """(number of records, {record: reason} for its cut images) of `path`.

    Raises naming the first label outside [0, num_classes). Images whose ends are not
    where their format puts them (`image_ends`) are decoded once here.
    """
    spec = {"image/class/label": tf.io.FixedLenFeature([], tf.int64),
            "image/encoded": tf.io.FixedLenFeature([], tf.string)}

    def ends(records):
        example = tf.io.parse_example(records, spec)
        return (example["image/class/label"], *image_ends.record_ends(example["image/encoded"]))

    count, cut = 0, {}
    for labels, headers, tails, sizes in tf.data.TFRecordDataset(path).batch(4096).map(ends).as_numpy_iterator():
        bad = np.flatnonzero((labels < 0) | (labels >= num_classes))
        if bad.size:
            raise ValueError(f"Record {count + bad[0]} of {path} has label {labels[bad[0]]}: labels must be in "
                             f"[0, {num_classes}) for num_classes={num_classes}")
        for i in np.flatnonzero([not image_ends.is_whole(*ends) for ends in zip(headers, tails, sizes, strict=True)]):
            reason = image_ends.decode_problem(_record_image(path, count + i), 3)
            if reason:
                cut[int(count + i)] = reason
        count += len(labels)
    return count, cut


def _record_image(path, record):
    return next(iter(tf.data.TFRecordDataset(path).skip(record).take(1).map(_parse_example)))[0]


def check_labels(ds, num_classes):
    """Fails the stream with InvalidArgument naming the label and its record's position in the split."""

    def check(position, example):
        image, label, *name = example  # (image, label) or (encoded image, label, name)
        inside = tf.logical_and(label >= 0, label < num_classes)
        assertion = tf.debugging.Assert(inside, [
            "Label", label, "of record", position, f"is outside [0, {num_classes}) (num_classes={num_classes})"])
        with tf.control_dependencies([assertion]):
            return image, tf.identity(label), *name

    return ds.enumerate().map(check, num_parallel_calls=AUTOTUNE, deterministic=True)


def _parse_example(record):
    """The Inception/Model Garden convention: image/encoded and image/class/label (still encoded)."""
    features = tf.io.parse_single_example(record, {
        "image/encoded": tf.io.FixedLenFeature([], tf.string),
        "image/class/label": tf.io.FixedLenFeature([], tf.int64),
    })
    return features["image/encoded"], features["image/class/label"]


def _decoded(named, channels, skip_bad_images):
    """(encoded image, label, name) examples -> (uint8 image, label), in order; see `_named_failures`."""
    return _named_failures(named, lambda data, label: (image_formats.decode(data, channels), label),
                          lambda data, label: (tf.zeros([0, 0, channels], tf.uint8), label), skip_bad_images)


def _named_failures(named, transform, stand_in, skip_bad_images):
    """`transform(*inputs)` of each `(*inputs, name)` of `named`, in order; a failing one is named.

    The pre-flight scan finds cut images by their ends; one that still fails
    here (changed since, or corrupt inside: a PNG whose middle bytes are
    damaged) stops the stream with InvalidArgument naming it, or with
    `skip_bad_images` is left out, named on stderr. tf.data has no
    try/except: blocks of `_BLOCK` examples are transformed in parallel with
    their errors dropped (`ignore_errors`), each result carrying its place in
    the block, and a gap in the places names what failed from the block's
    names (`stand_in(*inputs)`, of the results' structure, marks the block's
    end). `transform` must draw only stateless randomness: each block's
    dataset starts a stateful op's sequence afresh.
    """
    def block(*columns):
        *inputs, names = columns
        size = tf.shape(names, out_type=tf.int64)[0]
        done = tf.data.Dataset.from_tensor_slices((tf.range(size), *inputs)).map(
            lambda place, *x: (place, transform(*x)), num_parallel_calls=AUTOTUNE, deterministic=True)
        end = tf.data.Dataset.from_tensors((size, stand_in(*[column[0] for column in inputs])))
        results = done.ignore_errors().concatenate(end)
        if skip_bad_images:
            return (results.scan(tf.constant(0, tf.int64), functools.partial(_skip_gap, names))
                    .filter(lambda place, _: place < size).map(lambda _, output: output))
        # Whole, a block gives `size` results before its end; with a gap, its end is among the first `size`.
        return results.scan(tf.constant(0, tf.int64), functools.partial(_stop_at_gap, names)).take(size)

    return named.batch(_BLOCK).interleave(block, cycle_length=2, block_length=_BLOCK, num_parallel_calls=AUTOTUNE,
                                          deterministic=True)


# Examples per block of `_named_failures`: a block's datasets cost about as much as decoding a few images,
# and a larger block overlaps less with the next.
_BLOCK = 64


def _stop_at_gap(names, expected, result):
    """`scan` over (place, output): InvalidArgument naming the image at the first gap in the places."""
    place, output = result
    missing = tf.gather(names, tf.minimum(expected, tf.size(names, out_type=tf.int64) - 1))
    check = tf.debugging.Assert(tf.equal(place, expected), [
        "Cannot decode the image", missing, "(cut short, corrupt or an animated WebP; "
        "keras_vit.image_formats.decode of its bytes says which): fix or remove it, or pass --skip_bad_images "
        "to train without it"])
    with tf.control_dependencies([check]):
        return place + 1, tf.nest.map_structure(tf.identity, output)


def _skip_gap(names, expected, result):
    """`scan` over (place, output): a gap's images are named on stderr, which TF_CPP_MIN_LOG_LEVEL leaves."""
    place, _ = result

    def warn():
        with tf.control_dependencies([tf.print("Skipped", place - expected, "image(s) that cannot be decoded "
                                               "(--skip_bad_images):", names[expected:place],
                                               output_stream=sys.stderr, summarize=-1)]):
            return tf.identity(place)

    return tf.cond(place > expected, warn, lambda: tf.identity(place)) + 1, result


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


def _train_image(image, seed, recipe, cropped=False):
    """A training image from a decoded `image`, or from its inception crop (`_decode_inception_crop`) if `cropped`."""
    size = recipe.model.image_size
    seeds = tf.random.experimental.stateless_split(seed, 4)
    if recipe.train_crop == "inception" and not cropped:
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
    examples = source.dataset
    if encoded_channels:  # with each image's name, for `_named_failures`
        examples = source.named if source.named is not None else source.encoded.map(lambda data, label: (
            data, label, tf.constant("an image of the training split")))
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

    def seed_of(index):
        return tf.stack([tf.constant(recipe.seed, tf.int64), index])

    if encoded_channels:  # decoded by itself, the crop's seed first of `_train_image`'s four (stateless)
        def crop(index, data, label):
            window_seed = tf.random.experimental.stateless_split(seed_of(index), 4)[0]
            return index, (_decode_inception_crop(data, window_seed, encoded_channels), label)

        stand_in = lambda index, data, label: (index, (tf.zeros([0, 0, encoded_channels], tf.uint8), label))  # noqa: E731
        stream = _named_failures(stream.map(lambda index, example: (index, *example)), crop, stand_in,
                                source.skip_bad_images)

    # An image skipped here (skip_bad_images) leaves the chunk a batch short: Keras ends it a step early,
    # and the next chunk starts from the optimiser's step, as a resumed run would.
    def prepare(index, example):
        image, label = example
        return _train_image(image, seed_of(index), recipe, cropped=bool(encoded_channels)), label

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
    ds = source.dataset
    if not source.skip_bad_images:  # a count Keras knows (a held-out part's filter loses it): no "ran out" warning
        ds = ds.apply(tf.data.experimental.assert_cardinality(source.num_examples))
    ds = ds.map(lambda image, label: (eval_image(image, recipe), tf.one_hot(label, source.num_classes)),
                num_parallel_calls=AUTOTUNE, deterministic=True)
    return _shard_by_data(ds.batch(global_batch).prefetch(AUTOTUNE))


def hold_out(source, fraction, seed):
    """`(train, validation)`: `source` with a `fraction` of its examples held out, drawn by `seed`.

    A folder holds out by file name a share of each class of the images its pre-flight scan passed
    (`folders.hold_out`): an image that fails later, mid-stream, leaves its part without moving another
    across. Other sources hold out
    round(fraction * examples) by a numpy permutation of the example indices. Either way a run, its
    resumption and another machine hold out the same examples, and each part's decoded and encoded streams
    are taken from its own part of the named stream, so they hold the same examples. The two parts share no
    example, so they carry no record ranges (`check_disjoint` compares splits).
    """
    if source.files is not None:  # among the images the pre-flight scan passed: a class keeps its share
        scanned = source.files.keep(lambda path: path not in source.bad)
        return tuple(dataclasses.replace(_with_streams(_folder_source(part, {}), source.skip_bad_images),
                                         records=(), bad=source.bad, skipped=source.skipped if train else 0)
                     for part, train in zip(folders.hold_out(scanned, fraction, seed), (True, False), strict=True))
    count = source.num_examples
    held = int(round(fraction * count))
    mask = np.zeros(count, bool)
    mask[np.random.default_rng(seed).permutation(count)[:held]] = True
    table = tf.constant(mask)

    def pick(stream, keep):
        return stream.enumerate().filter(lambda i, _: tf.equal(tf.gather(table, i), keep)).map(lambda _, x: x)

    def part(keep):
        size = held if keep else count - held
        if source.named is None:  # a stream without names: the decoded one alone
            return dataclasses.replace(source, dataset=pick(source.dataset, keep), num_examples=size, records=())
        named = pick(source.named, keep)
        return dataclasses.replace(_with_streams(dataclasses.replace(source, named=named, num_examples=size),
                                                 source.skip_bad_images), records=(),
                                   skipped=0 if keep else source.skipped)

    return part(False), part(True)
