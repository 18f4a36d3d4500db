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

import tensorflow as tf

from keras_vit.preprocessing import preprocess_input, resize_and_center_crop

AUTOTUNE = tf.data.AUTOTUNE


@dataclasses.dataclass(frozen=True)
class Source:
    """An image-classification split: (uint8 image, int label) examples."""

    dataset: tf.data.Dataset
    num_examples: int
    num_classes: int
    channels: int


def load(name, split, data_dir=None, num_classes=0):
    """Opens `split` of `name` ("keras_vit_digits", "tfds:X", "folder:P", "tfrecord:G")."""
    import tensorflow_datasets as tfds

    kind, _, rest = name.partition(":")
    read = tfds.ReadConfig(shuffle_seed=0, interleave_cycle_length=1)
    if name == "keras_vit_digits" or kind == "tfds":
        if name == "keras_vit_digits":
            from trainers import digits  # registers the builder

            rest = digits.NAME
        builder = tfds.builder(rest, data_dir=data_dir)
        builder.download_and_prepare()
        ds = builder.as_dataset(split=split, as_supervised=True, shuffle_files=False, read_config=read)
        info = builder.info
        return Source(ds, info.splits[split].num_examples, info.features["label"].num_classes,
                      info.features["image"].shape[-1] or 3)
    if kind == "folder":
        builder = tfds.folder_dataset.ImageFolder(rest)
        ds = builder.as_dataset(split=split, as_supervised=True, shuffle_files=False, read_config=read)
        return Source(ds, builder.info.splits[split].num_examples,
                      builder.info.features["label"].num_classes, 3)
    if kind == "tfrecord":
        if not num_classes:
            raise ValueError(f"TFRecords carry no class count: set --num_classes for dataset={name!r}")
        files = sorted(tf.io.gfile.glob(rest.replace("{split}", split)))
        if not files:
            raise ValueError(f"No TFRecord files match {rest.replace('{split}', split)!r} (dataset={name!r})")
        ds = tf.data.TFRecordDataset(files).map(_parse_example, num_parallel_calls=AUTOTUNE)
        count = sum(1 for _ in tf.data.TFRecordDataset(files))
        return Source(ds, count, num_classes, 3)
    raise ValueError(
        "`dataset` must be 'keras_vit_digits', 'tfds:NAME', 'folder:PATH' or 'tfrecord:GLOB'; "
        f"received dataset={name!r}"
    )


def _parse_example(record):
    """The Inception/Model Garden convention: image/encoded and image/class/label."""
    features = tf.io.parse_single_example(record, {
        "image/encoded": tf.io.FixedLenFeature([], tf.string),
        "image/class/label": tf.io.FixedLenFeature([], tf.int64),
    })
    image = tf.io.decode_image(features["image/encoded"], channels=3, expand_animations=False)
    return image, features["image/class/label"]


def _train_image(image, seed, recipe):
    size = recipe.image_size
    seeds = tf.random.experimental.stateless_split(seed, 4)
    if recipe.train_crop == "inception":
        begin, crop, _ = tf.image.stateless_sample_distorted_bounding_box(
            tf.shape(image), tf.zeros([1, 0, 4]), seed=seeds[0], min_object_covered=0.0,
            aspect_ratio_range=(3 / 4, 4 / 3), area_range=(0.05, 1.0), max_attempts=10,
            use_image_if_no_bounding_boxes=True)
        image = tf.slice(image, begin, crop)
    image = tf.image.resize(image, (size, size), method="bilinear")
    if recipe.random_shift:
        pad = recipe.random_shift
        image = tf.pad(image, [[pad, pad], [pad, pad], [0, 0]])
        image = tf.image.stateless_random_crop(image, (size, size, tf.shape(image)[-1]), seed=seeds[1])
    if recipe.flip:
        image = tf.image.stateless_random_flip_left_right(image, seed=seeds[2])
    image = tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8)
    if recipe.randaugment_layers:
        from official.vision.ops import augment

        image = augment.RandAugment(
            num_layers=recipe.randaugment_layers, magnitude=recipe.randaugment_magnitude,
            magnitude_std=recipe.randaugment_magnitude_std, exclude_ops=["Cutout"]).distort(image)
    image = preprocess_input(image)
    if recipe.random_erasing:
        from official.vision.ops import augment

        image = augment.RandomErasing(probability=recipe.random_erasing).distort(image)
    return image


def eval_image(image, recipe):
    """Resize (short side to size / crop_fraction), centre crop, normalise."""
    image = resize_and_center_crop(image, (recipe.image_size,) * 2, recipe.eval_crop_fraction)
    return preprocess_input(tf.clip_by_value(tf.round(image), 0, 255))


def _split(ds, count, global_batch, input_context):
    """This input pipeline's shard, its size, its per-step share and the per-replica batch."""
    if input_context is None:
        return ds, count, global_batch, global_batch
    pipelines, index = input_context.num_input_pipelines, input_context.input_pipeline_id
    if pipelines > 1:
        ds = ds.shard(pipelines, index)
        count = len(range(index, count, pipelines))
    return ds, count, global_batch // pipelines, input_context.get_per_replica_batch_size(global_batch)


def train_dataset(recipe, source, global_batch, start_step, num_steps, input_context=None):
    """Steps `[start_step, start_step + num_steps)` of the training stream, in per-replica batches."""
    ds, count, per_step, batch_size = _split(source.dataset, source.num_examples, global_batch, input_context)
    start, stop = start_step * per_step, (start_step + num_steps) * per_step  # this pipeline's examples
    buffer = min(recipe.shuffle_buffer, count)
    # Epoch e is shuffled with its own seed: a Python int, hence the epochs are
    # listed here rather than generated in the graph.
    epochs = [ds.shuffle(buffer, seed=recipe.seed * 1_000_003 + e, reshuffle_each_iteration=False)
              for e in range(start // count, -(-stop // count))]
    stream = functools.reduce(tf.data.Dataset.concatenate, epochs).skip(start % count)
    stream = stream.enumerate(start=start)
    num_classes = source.num_classes

    def prepare(index, example):
        image, label = example
        seed = tf.stack([tf.constant(recipe.seed, tf.int64), index])
        return _train_image(image, seed, recipe), label

    stream = stream.map(prepare, num_parallel_calls=AUTOTUNE, deterministic=True)
    stream = stream.batch(batch_size, drop_remainder=True)
    if recipe.mixup_alpha or recipe.cutmix_alpha:
        from official.vision.ops import augment

        mixer = augment.MixupAndCutmix(mixup_alpha=recipe.mixup_alpha, cutmix_alpha=recipe.cutmix_alpha,
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


def eval_dataset(recipe, source, global_batch, input_context=None):
    """The evaluation split, in order, with one-hot labels, in per-replica batches."""
    ds, _, _, batch_size = _split(source.dataset, source.num_examples, global_batch, input_context)
    ds = ds.map(lambda image, label: (eval_image(image, recipe), tf.one_hot(label, source.num_classes)),
                num_parallel_calls=AUTOTUNE, deterministic=True)
    return _shard_by_data(ds.batch(batch_size).prefetch(AUTOTUNE))
