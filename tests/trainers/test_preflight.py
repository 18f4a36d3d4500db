"""Every bad flag, field and datum stops a run before its first step, names the culprit,
and leaves --model_dir byte for byte as it was. Nothing here trains."""

import hashlib
import pathlib
import re
import types

import numpy as np
import pytest
import tensorflow as tf

from keras_vit import image_formats
from trainers import data, loop, recipes

TINY = recipes.RECIPES["digits"].replace(hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1, batch_size=16,
                                         train_steps=4, checkpoint_every=2, steps_per_execution=1)
ONE_DEVICE = tf.distribute.get_strategy()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tfds")
    data.load("keras_vit_digits", "train", str(path))  # prepared once for the module
    return str(path)


def tree_hash(root):
    """Names, sizes and bytes of everything under `root` (absent: a fixed value)."""
    digest = hashlib.sha256()
    for path in sorted(pathlib.Path(root).rglob("*")) if pathlib.Path(root).exists() else []:
        digest.update(str(path.relative_to(root)).encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


@pytest.fixture
def model_dir(tmp_path):
    """An existing run directory with a file of its own, which must come out untouched."""
    path = tmp_path / "run"
    path.mkdir()
    (path / "notes.txt").write_text("a previous run's notes")
    return path


def refused(recipe, model_dir, data_dir, match, strategy=ONE_DEVICE, **kwargs):
    before = tree_hash(model_dir)
    with pytest.raises(loop.InvalidRun, match=match):
        loop.train(recipe, model_dir, strategy, "cpu", data_dir, **kwargs)
    assert tree_hash(model_dir) == before, "the refused run changed --model_dir"


@pytest.mark.parametrize("field, value, allowed", [
    ("learning_rate", float("nan"), r"must be in \(0, inf\); received learning_rate=nan"),
    ("learning_rate", float("inf"), r"received learning_rate=inf"),
    ("learning_rate", 0.0, r"received learning_rate=0.0"),
    ("shuffle_buffer", 0, r"`shuffle_buffer` must be in \[1, inf\); received shuffle_buffer=0"),
    ("eval_crop_fraction", 0.0, r"`eval_crop_fraction` must be in \(0, 1\]; received eval_crop_fraction=0.0"),
    ("eval_crop_fraction", 1.25, r"received eval_crop_fraction=1.25"),
    ("label_smoothing", -0.1, r"received label_smoothing=-0.1"),
    ("weight_decay", float("nan"), r"received weight_decay=nan"),
    ("warmup_steps", -1, r"received warmup_steps=-1"),
    ("random_erasing", 2.0, r"`random_erasing` must be in \[0, 1\]"),
    ("batch_size", 2.5, r"`batch_size` must be of type int; received batch_size=2.5"),
    ("flip", 1, r"`flip` must be of type bool"),
    ("schedule", "step", r"`schedule` must be one of"),
    ("jit_compile", "yes", r"`jit_compile` must be one of \('auto', 'true', 'false'\); received jit_compile='yes'"),
    ("jit_compile", True, r"`jit_compile` must be of type str; received jit_compile=True"),
    ("dataset", "csv:x", r"`dataset` must be one of .*received dataset='csv:x'"),
    ("dataset", "tfds:no_such_dataset", r"names no TFDS dataset: received dataset='tfds:no_such_dataset'"),
    ("pretrained", "/nowhere/w.npz", r"received pretrained='/nowhere/w.npz': no such file"),
    ("pretrained", "imagenet21k", r"`pretrained` weights by name need the model of a named variant"),
    ("dataset", "tfrecord:/nowhere/*", r"set `num_classes` >= 1"),
    ("num_classes", 7, r"`num_classes` must match the 10 classes .*received num_classes=7"),
    ("eval_split", "validation", r"split 'validation' is not one of the splits .*\['test', 'train'\], or a TFDS"),
    ("batch_size", 4096, r"`batch_size` must be <= the 1437 training examples"),
])
def test_a_bad_field_stops_the_run_and_writes_nothing(model_dir, data_dir, field, value, allowed):
    refused(TINY.replace(**{field: value}), model_dir, data_dir, allowed)


@pytest.mark.parametrize("field, value, allowed", [
    ("dropout_rate", 1.0, r"`dropout_rate` must be a float in \[0.0, 1\); received dropout_rate=1.0"),
    ("variant", "Q/3", r"`variant` must look like .*received variant='Q/3'"),
    ("patch_size", 3, r"divisible"),
    ("position_embedding", "rope", r"received position_embedding='rope'"),
])
def test_a_bad_model_field_is_refused_when_the_recipe_is_made(field, value, allowed):
    with pytest.raises(ValueError, match=allowed):
        TINY.replace(**{field: value})


def test_a_checkpoint_of_other_conventions_is_refused_before_the_run(model_dir, data_dir):
    """Fine-tuning from a timm DeiT file with the official GELU would compute another function from its weights."""
    deit = str(pathlib.Path(__file__).parents[1] / "fixtures" / "timm" / "deit")
    refused(TINY.replace(pretrained=deit), model_dir, data_dir,
            r"differs from .*deit in what its weights compute: classifier='gap' \(the checkpoint's: 'token'\).*"
            r"gelu_approximate=True \(the checkpoint's: False\).*input_mean")


@pytest.mark.parametrize("fields, allowed", [
    (dict(distillation="hard"), r"distillation='hard' needs a `teacher`"),
    (dict(distillation="soft", teacher="/nowhere/t.keras"), r"received teacher='/nowhere/t.keras': no such file"),
    (dict(distillation="hard", teacher="keras.applications.VGG16"), r"takes its own preprocessed inputs"),
    (dict(task="mpp", pretrained="/nowhere/w.npz"), r"no such file"),
    (dict(task="mpp", distillation="hard", teacher="keras.applications.ConvNeXtTiny"), r"needs distillation='none'"),
])
def test_a_bad_task_field_stops_the_run_and_writes_nothing(model_dir, data_dir, fields, allowed):
    refused(TINY.replace(**fields), model_dir, data_dir, allowed)


def test_rgb_only_augmentations_on_a_grey_dataset_are_named(model_dir, data_dir):
    assert set(recipes.RGB_ONLY) == {"randaugment_layers", "random_erasing", "mixup_alpha", "cutmix_alpha"}
    refused(TINY.replace(randaugment_layers=2, cutmix_alpha=1.0), model_dir, data_dir,
            r"take RGB images; 'keras_vit_digits' has 1 channel\(s\). Set these to 0: --randaugment_layers=2, "
            r"--cutmix_alpha=1.0$")


def test_a_teacher_that_does_not_fit_the_data_stops_the_run_and_writes_nothing(model_dir, data_dir, tmp_path):
    import keras

    teacher = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(3)])
    teacher.save(tmp_path / "teacher.keras")
    refused(TINY.replace(distillation="hard", teacher=str(tmp_path / "teacher.keras")), model_dir, data_dir,
            r"The teacher predicts 3 classes and the data has 10")


def test_an_unknown_weights_name_lists_the_variants_names(model_dir, data_dir):
    refused(TINY.replace(variant="Ti/16", image_size=32, pretrained="imagenet99"), model_dir, data_dir,
            r"No pretrained weights named 'imagenet99' for .*available:")


def test_a_bad_value_in_a_new_directory_does_not_create_it(tmp_path, data_dir):
    refused(TINY.replace(learning_rate=-1.0), tmp_path / "new", data_dir, "learning_rate")
    assert not (tmp_path / "new").exists()


def test_a_batch_the_replicas_do_not_divide_is_refused_before_the_data(model_dir):
    three = types.SimpleNamespace(num_replicas_in_sync=3)  # the check precedes any use of the strategy
    refused(TINY.replace(batch_size=16), model_dir, "/nonexistent", r"`batch_size` must be a multiple of the 3 "
            r"replicas in sync; received batch_size=16 \(nearest: 15\)", strategy=three)
    recipes.check_replicas(TINY.replace(batch_size=18), 3)
    with pytest.raises(ValueError, match=r"`batch_size` must be a multiple of the 3 replicas in sync x "
                                         r"grad_accumulation_steps=2; received batch_size=15 \(nearest: 12\)"):
        recipes.check_replicas(TINY.replace(batch_size=15, grad_accumulation_steps=2), 3)
    recipes.check_replicas(TINY.replace(batch_size=18, grad_accumulation_steps=3), 3)


def test_another_recipes_directory_keeps_its_record(model_dir, data_dir):
    (model_dir / "recipe.json").write_text(TINY.replace(seed=7).to_json())
    refused(TINY, model_dir, data_dir, "holds a run of another recipe")


def test_a_checkpoint_of_another_model_is_refused_before_recipe_json_is_written(model_dir, data_dir):
    """The restore is validated before the run writes its record (it used to overwrite it first)."""
    other = tf.Variable(tf.zeros([3, 3]))
    tf.train.CheckpointManager(tf.train.Checkpoint(model=[other]), str(model_dir / "checkpoints"), 1).save()
    refused(TINY, model_dir, data_dir, r"ckpt-1 does not restore into this recipe's model")
    assert not (model_dir / "recipe.json").exists()


def test_model_dir_that_is_a_file(tmp_path, data_dir):
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(loop.InvalidRun, match="--model_dir must be a directory"):
        loop.train(TINY, path, ONE_DEVICE, "cpu", data_dir)
    assert path.read_text() == "x"


def _write_tfrecord(path, labels):
    pixels = tf.io.encode_png(np.zeros((4, 4, 3), np.uint8)).numpy()
    with tf.io.TFRecordWriter(str(path)) as writer:
        for label in labels:
            writer.write(tf.train.Example(features=tf.train.Features(feature={
                "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[pixels])),
                "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
            })).SerializeToString())


def test_one_based_tfrecord_labels_are_named_by_file_and_record(tmp_path, model_dir):
    for split in ("train", "test"):
        _write_tfrecord(tmp_path / f"{split}-0.tfrecord", [1, 2, 3, 3, 2, 1])  # 1-based, 3 classes
    recipe = TINY.replace(dataset=f"tfrecord:{tmp_path}/{{split}}-*.tfrecord", num_classes=3, batch_size=2)
    refused(recipe, model_dir, None, r"Record 2 of .*train-0.tfrecord has label 3: labels must be in \[0, 3\)")


def test_labels_are_checked_as_they_stream():
    """The second line of defence, for data that changes after the scan: position and label named."""
    ds = tf.data.Dataset.from_tensor_slices((tf.zeros([4, 2, 2, 1], tf.uint8), tf.constant([0, 1, 5, 1], tf.int64)))
    message = r"\[Label\] \[5\] \[of record\] \[2\] \[is outside \[0, 3\)"
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        list(data.check_labels(ds, 3).as_numpy_iterator())
    assert [int(y) for _, y in data.check_labels(ds.take(2), 3)] == [0, 1]


def _image_folder(root):
    """train/ and test/ with two classes of three good images each, plus bad files in train/."""
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for label in ("cat", "dog"):
            folder = root / split / label
            folder.mkdir(parents=True)
            for i in range(3):
                pixels = rng.integers(0, 256, (12, 10, 3), dtype=np.uint8)
                (folder / f"{i}.png").write_bytes(tf.io.encode_png(pixels).numpy())
    bad = {root / "train" / "cat" / "empty.jpg": b"",
           root / "train" / "dog" / "page.jpg": b"<html>404 Not Found</html>",
           root / "train" / "dog" / "cut.png": b"\x89PNG\r\n\x1a\n\x00"}
    for path, content in bad.items():
        path.write_bytes(content)
    return bad


def test_undecodable_folder_images_are_listed_by_path(tmp_path, model_dir):
    bad = _image_folder(tmp_path / "images")
    recipe = TINY.replace(dataset=f"folder:{tmp_path / 'images'}", batch_size=2)
    before = tree_hash(model_dir)
    with pytest.raises(loop.InvalidRun, match=r"(?s)3 of the images of split 'train'.*--skip_bad_images") as error:
        loop.train(recipe, model_dir, ONE_DEVICE, "cpu")
    for path in bad:
        assert str(path) in str(error.value)
    assert "empty (0 bytes)" in str(error.value) and "not a JPEG, PNG, GIF, BMP or WebP image" in str(error.value)
    assert "truncated (9 bytes)" in str(error.value) and tree_hash(model_dir) == before


def test_a_gif_bmp_or_webp_saved_as_jpg_passes_the_scan_as_the_decoder_reads_it(tmp_path):
    import io

    from PIL import Image

    from trainers import image_scan

    pixels = np.random.default_rng(0).integers(0, 256, (12, 10, 3), dtype=np.uint8)
    for kind in ("GIF", "BMP", "WEBP"):
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format=kind)
        path = tmp_path / f"{kind}.jpg"
        path.write_bytes(buffer.getvalue())
        assert image_scan.problem(str(path)) is None, kind
        assert image_formats.decode(buffer.getvalue(), 3).shape == (12, 10, 3)
        assert image_formats.decode(buffer.getvalue(), 1).shape == (12, 10, 1), kind  # their decoders have no grey
    (tmp_path / "page.jpg").write_bytes(b"RIFF\0\0\0\0WAVEfmt ")  # RIFF, but sound
    assert image_scan.problem(str(tmp_path / "page.jpg")).startswith("not a JPEG, PNG, GIF, BMP or WebP")


def _webp(options, frames=1, alpha=True):
    import io

    from PIL import Image

    rng = np.random.default_rng(0)
    images = [Image.fromarray(np.dstack([rng.integers(0, 256, (12, 10, 3), dtype=np.uint8),
                                         np.full((12, 10), 200 if alpha else 255, np.uint8)])) for _ in range(frames)]
    buffer = io.BytesIO()
    images[0].save(buffer, format="WEBP", **options, **(dict(save_all=True, append_images=images[1:]) if frames > 1
                                                         else {}))
    return buffer.getvalue(), np.asarray(images[0])


@pytest.mark.parametrize("lossless", [True, False])
def test_a_webp_with_alpha_passes_the_scan_and_trains_as_its_colour(tmp_path, lossless):
    from trainers import image_scan

    encoded, rgba = _webp(dict(lossless=lossless, quality=100))
    (tmp_path / "image.jpg").write_bytes(encoded)
    assert image_scan.problem(str(tmp_path / "image.jpg")) is None
    colour, grey = image_formats.decode(encoded, 3).numpy(), image_formats.decode(encoded, 1).numpy()
    assert colour.shape == (12, 10, 3) and grey.shape == (12, 10, 1)
    if lossless:  # the alpha dropped, the colour kept exactly
        np.testing.assert_array_equal(colour, rgba[..., :3])
    expected = np.round(tf.image.rgb_to_grayscale(colour.astype(np.float32)).numpy())
    np.testing.assert_array_equal(grey, expected)


def test_an_animated_webp_is_found_by_the_scan_and_refused_by_the_decoder(tmp_path):
    from trainers import image_scan

    encoded, _ = _webp(dict(duration=100), frames=3, alpha=False)
    (tmp_path / "image.jpg").write_bytes(encoded)
    assert image_scan.problem(str(tmp_path / "image.jpg")).startswith("an animated WebP")
    for channels in (3, 1):  # a TFRecord's image meets no scan: an error, not TensorFlow's crash
        with pytest.raises(tf.errors.InvalidArgumentError, match="an animated WebP"):
            image_formats.decode(encoded, channels)


def test_skip_bad_images_goes_on_without_them(tmp_path, caplog):
    _image_folder(tmp_path)
    recipe = TINY.replace(dataset=f"folder:{tmp_path}", batch_size=2)
    with caplog.at_level("WARNING"):
        source, _ = loop._load_sources(recipe, None, skip_bad_images=True)
    assert "Skipped 3 undecodable images of split 'train' (--skip_bad_images)" in caplog.text
    assert (source.num_examples, source.skipped, source.num_classes) == (6, 3, 2)
    examples = list(source.dataset.as_numpy_iterator())
    assert len(examples) == 6 and all(image.shape == (12, 10, 3) for image, _ in examples)
    assert sorted(int(label) for _, label in examples) == [0, 0, 0, 1, 1, 1]


@pytest.mark.parametrize("train_split, eval_split, shared", [
    ("train", "train", r"train.tfrecord-00000-of-00001, records 0 to 1436"),
    ("train[:80%]", "train[70%:]", r"train.tfrecord-00000-of-00001, records 1006 to 1149"),
    ("train+test", "test", r"test.tfrecord-00000-of-00001, records 0 to 359"),
])
def test_an_evaluation_split_sharing_training_examples_is_refused(model_dir, data_dir, train_split, eval_split,
                                                                   shared):
    refused(TINY.replace(train_split=train_split, eval_split=eval_split), model_dir, data_dir,
            rf"Splits '{re.escape(train_split)}' and '{re.escape(eval_split)}' of dataset='keras_vit_digits' "
            rf"share examples \(.*{shared}\): an accuracy measured on training examples would be overstated")


def test_tfds_slices_that_do_not_overlap_are_read(data_dir):
    train_part = data.load("keras_vit_digits", "train[:99%]", data_dir)
    held_out = data.load("keras_vit_digits", "train[99%:]", data_dir)
    data.check_disjoint("keras_vit_digits", "train[:99%]", train_part, "train[99%:]", held_out)
    assert (train_part.num_examples, held_out.num_examples) == (1423, 14)
    assert len(list(held_out.dataset)) == 14
    with pytest.raises(ValueError, match=r"split 'train\[:99%' is not one of the splits .*or a TFDS slice"):
        data.load("keras_vit_digits", "train[:99%", data_dir)


def test_a_folder_or_tfrecord_split_read_twice_is_refused(tmp_path, model_dir):
    _image_folder(tmp_path / "images")
    refused(TINY.replace(dataset=f"folder:{tmp_path / 'images'}", batch_size=2, eval_split="train"), model_dir,
            None, r"Splits 'train' and 'train' of dataset='folder:.*' share examples \(.*images/train/cat\)",
            skip_bad_images=True)
    for split in ("train", "test"):
        _write_tfrecord(tmp_path / f"{split}-0.tfrecord", [0, 1, 2, 2])
    recipe = TINY.replace(dataset=f"tfrecord:{tmp_path}/{{split}}-*.tfrecord", num_classes=3, batch_size=2)
    refused(recipe.replace(eval_split="train"), model_dir, None, r"share examples \(.*train-0.tfrecord\)")
    _, evaluation = loop._load_sources(recipe, None, False)  # other files: read
    assert evaluation.num_examples == 4


def test_an_empty_evaluation_split_is_refused_before_the_run(tmp_path, model_dir):
    # Else the run trained to its end, then failed to evaluate and wrote no model.
    _write_tfrecord(tmp_path / "train-0.tfrecord", [0, 1, 2, 2])
    _write_tfrecord(tmp_path / "test-0.tfrecord", [])
    recipe = TINY.replace(dataset=f"tfrecord:{tmp_path}/{{split}}-*.tfrecord", num_classes=3, batch_size=2)
    refused(recipe, model_dir, None, r"The evaluation split 'test' of 'tfrecord:.*' holds no examples")


def test_a_tfrecord_glob_without_its_split_is_refused(model_dir, data_dir):
    # Without `{split}` the evaluation would read the training files.
    refused(TINY.replace(dataset="tfrecord:/data/*.tfrecord", num_classes=10), model_dir, data_dir,
            r"must hold `\{split\}`.*received dataset='tfrecord:/data/\*.tfrecord'")


@pytest.mark.parametrize("field, value", [("randaugment_layers", 2), ("random_erasing", 0.5), ("mixup_alpha", 0.8),
                                          ("cutmix_alpha", 1.0)])
def test_rgb_only_augmentations_on_grey_images_are_refused(model_dir, data_dir, field, value):
    # Model Garden's ops index and tile three channels; the digits have one.
    refused(TINY.replace(**{field: value}), model_dir, data_dir,
            rf"has 1 channel\(s\)\. Set these to 0: --{field}={value}")
