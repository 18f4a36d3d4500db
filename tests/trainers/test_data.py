import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from keras_vit import image_formats
from trainers import data, recipes

RECIPE = recipes.RECIPES["digits"]


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    return tmp_path_factory.mktemp("tfds")


def test_digits_builder_has_the_fixed_split(digits):
    train = data.load("keras_vit_digits", "train", str(digits))
    test = data.load("keras_vit_digits", "test", str(digits))
    assert (train.num_examples, test.num_examples, train.num_classes, train.channels) == (1437, 360, 10, 1)
    images, labels = zip(*test.dataset.as_numpy_iterator(), strict=True)
    images = np.stack(images)
    assert images.shape == (360, 8, 8, 1) and images.dtype == np.uint8 and images.max() == 255
    from sklearn.datasets import load_digits

    reference = load_digits()
    expected = np.round(reference.images[::5] * 255 / 16).astype(np.uint8)
    # TFDS stores examples in a hashed order; the split's content is fixed.
    assert sorted(a.tobytes() for a in images[..., 0]) == sorted(a.tobytes() for a in expected)
    assert sorted(labels) == sorted(reference.target[::5].tolist())


def _batches(source, start, steps, recipe=RECIPE):
    ds = data.train_dataset(recipe, source, 32, start, steps)
    return [(x.numpy(), y.numpy()) for x, y in ds.take(steps)]


def test_the_stream_resumes_exactly_where_it_stopped(digits):
    source = data.load("keras_vit_digits", "train", str(digits))
    recipe = RECIPE.replace(train_crop="inception", flip=True, random_shift=1)
    whole = _batches(source, 0, 100, recipe)  # > 2 epochs of 1,437 at batch 32
    resumed = _batches(source, 60, 40, recipe)
    for (a, la), (b, lb) in zip(whole[60:], resumed, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(la, lb)
    assert not np.array_equal(whole[0][0], whole[1][0])


def test_epochs_are_permutations_with_smoothed_labels(digits):
    source = data.load("keras_vit_digits", "train", str(digits))
    recipe = RECIPE.replace(random_shift=0, label_smoothing=0.1)
    batches = _batches(source, 0, 1437 // 32 + 1, recipe)
    labels = np.concatenate([y for _, y in batches])
    assert labels.shape[1] == 10 and np.allclose(labels.sum(1), 1.0) and np.isclose(labels.max(), 0.91)
    images = np.concatenate([x for x, _ in batches])[:1437]
    assert images.min() >= -1 and images.max() <= 1
    assert len({im.tobytes() for im in images}) > 1400  # nearly all distinct digits in one epoch


def test_eval_resizes_and_centre_crops():
    recipe = RECIPE.replace(image_size=16, eval_crop_fraction=0.5)
    image = tf.reshape(tf.range(16 * 24, dtype=tf.float32) % 256, (16, 24, 1))
    out = data.eval_image(image, recipe)
    assert tuple(out.shape) == (16, 16, 1) and float(tf.reduce_max(out)) <= 1.0


def _write_images(root, split, count_per_class):
    rng = np.random.default_rng(0)
    for label in ("cat", "dog"):
        folder = root / split / label
        folder.mkdir(parents=True)
        for i in range(count_per_class):
            pixels = rng.integers(0, 256, (12, 10, 3), dtype=np.uint8)
            encode = tf.io.encode_png if i % 2 else tf.io.encode_jpeg
            (folder / f"{i}.{'png' if i % 2 else 'jpg'}").write_bytes(encode(pixels).numpy())


def test_a_folder_of_jpeg_and_png(tmp_path):
    _write_images(tmp_path, "train", 3)
    source = data.load(f"folder:{tmp_path}", "train")
    assert (source.num_examples, source.num_classes) == (6, 2)
    recipe = RECIPE.replace(image_size=8, random_shift=0)
    x, y = next(iter(data.train_dataset(recipe, source, 4, 0, 1)))
    assert tuple(x.shape) == (4, 8, 8, 3) and tuple(y.shape) == (4, 2)


def _photo(height, width, seed):
    """Smooth gradients plus noise, as a photo: JPEG's chroma subsampling then has something to round."""
    rng = np.random.default_rng(seed)
    y, x = np.meshgrid(np.linspace(0, 1, height), np.linspace(0, 1, width), indexing="ij")
    pixels = np.stack([x, y, 1 - x * y], -1) * 200 + rng.normal(0, 20, (height, width, 3))
    return np.clip(pixels, 0, 255).astype(np.uint8)


def _decoded_crop(data_bytes, seed):
    image = image_formats.decode(data_bytes, 3)
    return tf.slice(image, *data._inception_window(tf.shape(image), seed)).numpy()


def test_the_inception_crop_decodes_only_the_window_of_a_jpeg():
    pixels = _photo(75, 100, 0)
    for s in range(20):
        seed = tf.constant([0, s], tf.int64)
        png = tf.io.encode_png(pixels)
        np.testing.assert_array_equal(data._decode_inception_crop(png, seed, 3).numpy(), _decoded_crop(png, seed))
        exact = tf.io.encode_jpeg(pixels, chroma_downsampling=False)  # 4:4:4: nothing to interpolate across
        np.testing.assert_array_equal(data._decode_inception_crop(exact, seed, 3).numpy(), _decoded_crop(exact, seed))
        # 4:2:0 (the usual photo): the same window; chroma upsampling may round a few edge pixels otherwise.
        subsampled = tf.io.encode_jpeg(pixels)
        fused, plain = data._decode_inception_crop(subsampled, seed, 3).numpy(), _decoded_crop(subsampled, seed)
        assert fused.shape == plain.shape
        assert np.mean(fused != plain) < 0.05 and np.mean(np.abs(fused.astype(int) - plain)) < 0.5
    grey = tf.io.encode_jpeg(pixels[..., :1])
    assert data._decode_inception_crop(grey, tf.constant([1, 2], tf.int64), 3).shape[-1] == 3


def test_training_from_bytes_gives_the_decoded_streams_batches(tmp_path):
    for label in ("a", "b"):
        (tmp_path / "train" / label).mkdir(parents=True)
        for i in range(6):
            pixels, path = _photo(40 + 7 * i, 60 - 3 * i, i), tmp_path / "train" / label / f"{i}"
            if i % 2:
                path.with_suffix(".png").write_bytes(tf.io.encode_png(pixels).numpy())
            else:
                path.with_suffix(".jpg").write_bytes(tf.io.encode_jpeg(pixels, chroma_downsampling=False).numpy())
    source = data.load(f"folder:{tmp_path}", "train")
    assert source.encoded is not None
    recipe = recipes.RECIPES["deit"].replace(image_size=16, batch_size=4, shuffle_buffer=12, randaugment_layers=0,
                                             mixup_alpha=0.0, cutmix_alpha=0.0, random_erasing=0.0)
    from_bytes = list(data.train_dataset(recipe, source, 4, 0, 6).as_numpy_iterator())
    decoded = list(data.train_dataset(recipe, dataclasses.replace(source, encoded=None), 4, 0, 6).as_numpy_iterator())
    for (x, y), (x_decoded, y_decoded) in zip(from_bytes, decoded, strict=True):
        np.testing.assert_array_equal(y, y_decoded)
        np.testing.assert_array_equal(x, x_decoded)  # 4:4:4 JPEGs and PNGs decode the same either way


def test_tfrecords_of_encoded_images(tmp_path):
    path = tmp_path / "train-00000.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as writer:
        for label in range(5):
            pixels = np.full((6, 6, 3), label * 40, np.uint8)
            example = tf.train.Example(features=tf.train.Features(feature={
                "image/encoded": tf.train.Feature(
                    bytes_list=tf.train.BytesList(value=[tf.io.encode_png(pixels).numpy()])),
                "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
            }))
            writer.write(example.SerializeToString())
    source = data.load(f"tfrecord:{tmp_path}/{{split}}-*.tfrecord", "train", num_classes=5)
    assert source.num_examples == 5
    images, labels = zip(*source.dataset.as_numpy_iterator(), strict=True)
    assert list(labels) == [0, 1, 2, 3, 4] and images[2][0, 0, 0] == 80
    encoded = list(source.encoded.as_numpy_iterator())  # what the inception crop decodes from
    assert [label for _, label in encoded] == list(labels) and encoded[2][0].startswith(b"\x89PNG")
    with pytest.raises(ValueError, match="set --num_classes"):
        data.load(f"tfrecord:{tmp_path}/*.tfrecord", "train")


def test_unknown_dataset_kind():
    with pytest.raises(ValueError, match="received dataset='csv:x'"):
        data.load("csv:x", "train")


def test_the_deit_augmentations_from_model_garden_run(digits):
    """RandAugment, Mixup/CutMix and random erasing (Model Garden) on 3-channel images."""
    source = data.load("keras_vit_digits", "train", str(digits))
    rgb = data.Source(source.dataset.map(lambda x, y: (tf.image.grayscale_to_rgb(x), y)),
                      source.num_examples, source.num_classes, 3)
    recipe = recipes.RECIPES["deit"].replace(image_size=16, batch_size=8, shuffle_buffer=100)
    images, labels = next(iter(data.train_dataset(recipe, rgb, 8, 0, 1)))
    assert tuple(images.shape) == (8, 16, 16, 3) and tuple(labels.shape) == (8, 10)
    np.testing.assert_allclose(labels.numpy().sum(1), 1.0, atol=1e-5)
    assert labels.numpy().max() < 1.0  # smoothed and mixed, never one-hot


def test_each_chunk_draws_its_own_mixup_and_randaugment(digits):
    """Model Garden's augmentations draw with stateful ops: each chunk of a run must not replay the first's draws."""
    source = data.load("keras_vit_digits", "train", str(digits))
    rgb = data.Source(source.dataset.map(lambda x, y: (tf.image.grayscale_to_rgb(x), y)),
                      source.num_examples, source.num_classes, 3)
    recipe = RECIPE.replace(mixup_alpha=0.8, label_smoothing=0.0, random_shift=0, flip=False, shuffle_buffer=1)
    tf.random.set_seed(0)  # as the trainer does once, before its first chunk

    def weights(start):  # each example's own-label weight: Mixup's lambda (or 1: a partner of the same label)
        return np.stack([y.max(1) for _, y in _batches(rgb, start, 3, recipe)])

    first, second = weights(0), weights(3)
    mixed = (first < 1) & (second < 1)
    assert mixed.sum() > 20 and np.isclose(first, second)[mixed].mean() < 0.2
    # RandAugment on one image repeated: its draws alone make the copies differ, and differ between chunks.
    repeated = data.Source(tf.data.Dataset.from_tensors(next(iter(rgb.dataset))).repeat(64), 64, 10, 3)
    augmented = RECIPE.replace(image_size=8, randaugment_layers=2, randaugment_magnitude=9, random_shift=0,
                               flip=False, shuffle_buffer=1)
    chunks = [_batches(repeated, start, 1, augmented)[0][0] for start in (0, 2)]
    same = [any(np.array_equal(image, other) for other in chunks[0]) for image in chunks[1]]
    assert np.mean(same) < 0.5



def test_a_tfds_dataset_not_at_hand_is_named_with_how_to_prepare_it(tmp_path):
    # ImageNet needs a manual download: TFDS' own failure is a long traceback naming neither step.
    with pytest.raises(ValueError, match=r"tfds:imagenet2012 is not prepared in .*put its files in .*downloads/manual"):
        data.load("tfds:imagenet2012", "train", data_dir=str(tmp_path))
    assert not (tmp_path / "imagenet2012").exists() or not any((tmp_path / "imagenet2012").rglob("*.tfrecord*"))


def test_the_validation_split_is_a_seeded_disjoint_part_of_the_training_split():
    source = data.Source(tf.data.Dataset.range(200).map(lambda i: (i, i % 3)), 200, 3, 1)
    train, validation = data.hold_out(source, 0.1, seed=0)
    ids = lambda part: [int(i) for i, _ in part.dataset]  # noqa: E731
    assert (train.num_examples, validation.num_examples) == (180, 20)
    assert len(ids(train)) == 180 and len(ids(validation)) == 20
    assert sorted(ids(train) + ids(validation)) == list(range(200))
    assert ids(train) == sorted(ids(train))  # each part keeps the source's order
    assert ids(data.hold_out(source, 0.1, seed=0)[1]) == ids(validation)  # a resumed run holds out the same
    assert ids(data.hold_out(source, 0.1, seed=1)[1]) != ids(validation)
    assert train.encoded is None and train.records == ()
