"""Images cut after their header, and folders that cannot train a classifier, are named before the first step."""

import numpy as np
import pytest
import tensorflow as tf

from trainers import data, image_ends, loop, recipes

TINY = recipes.RECIPES["digits"].replace(hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1, batch_size=2,
                                         train_steps=4, checkpoint_every=2, steps_per_execution=1)


def _jpeg(seed, size=24):
    pixels = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
    return tf.io.encode_jpeg(pixels).numpy()


def _cut(encoded):
    """The header and the first scan lines: the header-only scan passes it, the decoder fails on it."""
    return encoded[: len(encoded) // 2]


def _folder(root, cut_name="cut.jpg", classes=("cat", "dog")):
    for split in ("train", "test"):
        for k, label in enumerate(classes):
            (root / split / label).mkdir(parents=True)
            for i in range(3):
                (root / split / label / f"{i}.jpg").write_bytes(_jpeg(10 * k + i))
    path = root / "train" / classes[0] / cut_name
    path.write_bytes(_cut(_jpeg(99)))
    return path


def _tfrecord(path, images):
    with tf.io.TFRecordWriter(str(path)) as writer:
        for label, image in enumerate(images):
            writer.write(tf.train.Example(features=tf.train.Features(feature={
                "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image])),
                "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label % 2])),
            })).SerializeToString())


def test_a_cut_jpeg_passes_the_header_scan_but_not_the_decoder():
    """What the ends check is for: without it the run stopped at this image with an unnamed error."""
    from trainers import image_scan

    cut = _cut(_jpeg(0))
    with pytest.raises(tf.errors.InvalidArgumentError, match="jpeg::Uncompress failed"):
        tf.io.decode_jpeg(cut)
    assert not image_ends.is_whole(cut[:32], cut[-16:], len(cut))
    assert image_ends.decode_problem(cut, 3).startswith("cannot be decoded, cut short or corrupt (")
    whole = _jpeg(0)
    assert image_ends.is_whole(whole[:32], whole[-16:], len(whole))
    padded = whole + b"\0" * 8  # bytes after EOI: whole
    assert image_ends.is_whole(padded[:32], padded[-16:], len(padded))
    trailer = whole + b"camera maker's data"  # not whole by its ends, but the decoder reads it: kept
    assert not image_ends.is_whole(trailer[:32], trailer[-16:], len(trailer))
    assert image_ends.decode_problem(trailer, 3) is None
    png = tf.io.encode_png(np.zeros((8, 8, 3), np.uint8)).numpy()
    assert image_ends.is_whole(png[:32], png[-16:], len(png)) and not image_ends.is_whole(png[:40], png[:40][-16:], 40)
    del image_scan  # the header scan alone passes it: asserted on a file below


def test_a_cut_jpeg_in_a_folder_is_named_before_anything_is_written(tmp_path):
    from trainers import image_scan

    path = _folder(tmp_path / "images")
    assert image_scan.problem(str(path)) is None  # the header scan alone lets it through
    model_dir = tmp_path / "run"
    with pytest.raises(loop.InvalidRun, match=r"(?s)1 of the images of split 'train'.*--skip_bad_images") as error:
        loop.train(TINY.replace(dataset=f"folder:{tmp_path / 'images'}"), model_dir, tf.distribute.get_strategy())
    assert f"{path}: cannot be decoded, cut short or corrupt" in str(error.value)
    assert not model_dir.exists()


def test_a_cut_jpeg_in_a_folder_is_skipped_and_counted_with_skip_bad_images(tmp_path, caplog):
    _folder(tmp_path)
    with caplog.at_level("WARNING"):
        source, _ = loop._load_sources(TINY.replace(dataset=f"folder:{tmp_path}"), None, skip_bad_images=True)
    assert "Skipped 1 undecodable images of split 'train' (--skip_bad_images)" in caplog.text
    assert (source.num_examples, source.skipped) == (6, 1)
    assert len(list(source.dataset.as_numpy_iterator())) == 6
    batches = list(data.train_dataset(TINY.replace(image_size=8), source, 2, 0, 6).as_numpy_iterator())
    assert len(batches) == 6  # two epochs stream without meeting it


def test_a_cut_jpeg_in_a_tfrecord_is_named_by_file_and_record(tmp_path):
    good = [_jpeg(i) for i in range(6)]
    _tfrecord(tmp_path / "train-0.tfrecord", good[:3])
    _tfrecord(tmp_path / "train-1.tfrecord", [good[3], _cut(_jpeg(99)), good[4], good[5]])
    pattern = f"tfrecord:{tmp_path}/{{split}}-*.tfrecord"
    with pytest.raises(ValueError, match=r"(?s)1 of the images of split 'train' .*\n  record 1 of .*train-1.tfrecord: "
                                         r"cannot be decoded, cut short or corrupt.*--skip_bad_images"):
        data.load(pattern, "train", num_classes=2)
    source = data.load(pattern, "train", num_classes=2, skip_bad_images=True)
    assert (source.num_examples, source.skipped) == (6, 1)
    images = [image for image, _ in source.dataset.as_numpy_iterator()]
    expected = [tf.io.decode_jpeg(image).numpy() for image in good]
    assert len(images) == 6 and all(np.array_equal(a, b) for a, b in zip(images, expected, strict=True))
    assert [bytes(image) for image, _ in source.encoded.as_numpy_iterator()] == good


def test_a_folder_of_one_class_is_refused_naming_it(tmp_path):
    _folder(tmp_path, classes=("cat",))
    with pytest.raises(ValueError, match=r"has one class \('cat' in .*/train\): a classifier needs at least 2"):
        data.load(f"folder:{tmp_path}", "train", skip_bad_images=True)


@pytest.mark.parametrize("layout, found", [
    ("train/0.jpg", r"found 1 images directly in .*/train, in no LABEL folder: put each class's images in its own "
                    r"folder, .*/train/LABEL/"),
    ("train/cat/", r"found label folders \['train/cat'\] without images"),
])
def test_a_folder_in_another_layout_says_which_is_expected(tmp_path, layout, found):
    (tmp_path / layout).parent.mkdir(parents=True, exist_ok=True)
    if layout.endswith(".jpg"):
        (tmp_path / layout).write_bytes(_jpeg(0))
    else:
        (tmp_path / layout).mkdir(exist_ok=True)
    with pytest.raises(ValueError, match=r"holds no images where they are expected: expected .*/SPLIT/LABEL/IMAGE "
                                         r"\(.jpg, .jpeg or .png\), one LABEL folder per class; " + found):
        data.load(f"folder:{tmp_path}", "train")


def _damaged_png(seed):
    """A PNG whose middle bytes are damaged: its ends are whole, so the pre-flight passes it; its decoder fails."""
    png = bytearray(tf.io.encode_png(np.random.default_rng(seed).integers(0, 256, (24, 24, 3), np.uint8)).numpy())
    png[len(png) // 2: len(png) // 2 + 8] = b"\xa5" * 8
    return bytes(png)


def test_an_image_that_fails_mid_run_is_named(tmp_path):
    _folder(tmp_path, cut_name="0.jpg")  # replaced below: the folder's cut file is a good one now
    (tmp_path / "train" / "cat" / "0.jpg").write_bytes(_jpeg(5))
    damaged = tmp_path / "train" / "dog" / "damaged.png"
    damaged.write_bytes(_damaged_png(0))
    source = data.load(f"folder:{tmp_path}", "train")  # the pre-flight passes it
    assert source.skipped == 0
    stopped = r"Cannot decode the image\] \[.*damaged.png\] \[\(cut short, corrupt or an animated WebP.*--skip_bad"
    with pytest.raises(tf.errors.InvalidArgumentError, match=stopped):
        list(source.dataset.as_numpy_iterator())
    inception = recipes.RECIPES["deit"].replace(image_size=16, batch_size=2, shuffle_buffer=8, randaugment_layers=0,
                                                mixup_alpha=0.0, cutmix_alpha=0.0, random_erasing=0.0)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"Cannot decode the image\] \[.*damaged.png\]"):
        list(data.train_dataset(inception, source, 2, 0, 7).as_numpy_iterator())  # decoded from its bytes


def test_an_image_that_fails_mid_run_is_skipped_and_logged_with_skip_bad_images(tmp_path, capfd):
    _folder(tmp_path, cut_name="0.jpg")
    (tmp_path / "train" / "cat" / "0.jpg").write_bytes(_jpeg(5))
    (tmp_path / "train" / "dog" / "damaged.png").write_bytes(_damaged_png(0))
    source = data.load(f"folder:{tmp_path}", "train", skip_bad_images=True)
    images = list(source.dataset.as_numpy_iterator())
    assert len(images) == 6 and all(image.shape == (24, 24, 3) for image, _ in images)
    logged = capfd.readouterr().err
    assert "Skipped 1 image(s) that cannot be decoded (--skip_bad_images):" in logged and "damaged.png" in logged
    inception = recipes.RECIPES["deit"].replace(image_size=16, batch_size=2, shuffle_buffer=8, randaugment_layers=0,
                                                mixup_alpha=0.0, cutmix_alpha=0.0, random_erasing=0.0)
    assert len(list(data.train_dataset(inception, source, 2, 0, 3).as_numpy_iterator())) == 3


def test_a_run_meeting_an_image_that_fails_stops_naming_it_before_a_later_checkpoint(tmp_path):
    _folder(tmp_path / "images", cut_name="0.jpg")
    (tmp_path / "images" / "train" / "cat" / "0.jpg").write_bytes(_jpeg(5))
    (tmp_path / "images" / "train" / "dog" / "damaged.png").write_bytes(_damaged_png(0))
    model_dir = tmp_path / "run"
    recipe = TINY.replace(dataset=f"folder:{tmp_path / 'images'}", image_size=8, random_shift=0, train_steps=8)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"Cannot decode the image\] \[.*damaged.png\]"):
        loop.train(recipe, model_dir, tf.distribute.get_strategy())
    # 7 images, 2 a step: it is met by step 4, so no checkpoint after step 4 and no final model.
    steps = [int(p.name.split("-")[1].split(".")[0]) for p in (model_dir / "checkpoints").glob("ckpt-*.index")]
    assert not (model_dir / "model.keras").exists() and all(step <= 4 for step in steps), steps
