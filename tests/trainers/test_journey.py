"""Your own images, start to finish: a train-only folder and a pretrained file fine-tune in one command; every
problem of a command line is named at once, before TensorFlow starts; a folder's splits, slices and hold-out are
keyed by file name, so skipped images move nothing across."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from trainers import folders, plan

ROOT = pathlib.Path(__file__).parents[2]
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
CLASSES = ("cat", "dog", "owl")


def _png(height, width, seed):
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    return tf.io.encode_png(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).numpy()


def make_folder(root, per_class=10, splits=("train",)):
    """ROOT/SPLIT/LABEL/*.png of three classes, images of odd sizes."""
    rng = np.random.default_rng(0)
    for split in splits:
        for k, label in enumerate(CLASSES):
            (root / split / label).mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                height, width = (int(n) for n in rng.integers(13, 41, 2))
                (root / split / label / f"{label}{i}.png").write_bytes(_png(height, width, 100 * k + i))
    return root


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A tiny ViT checkpoint at 16 px with a 5-class head, in the official .npz format."""
    import keras_vit

    model = keras_vit.ViT(patch_size=4, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1,
                          input_shape=(16, 16, 3), classes=5)
    return str(keras_vit.save_npz(model, tmp_path_factory.mktemp("ckpt") / "tiny.npz"))


def train(*flags, timeout=600):
    return subprocess.run([sys.executable, "-m", "trainers.train", *flags], cwd=ROOT, env=ENV, capture_output=True,
                          text=True, timeout=timeout)


def test_one_command_fine_tunes_a_checkpoint_on_a_train_only_folder(tmp_path, pretrained):
    images = make_folder(tmp_path / "pets")
    bad = images / "train" / "dog" / "dog_cut.png"
    bad.write_bytes(_png(20, 20, 7)[:60])  # cut after its header: --skip_bad_images leaves it out, named
    model_dir = tmp_path / "run"
    result = train(f"--dataset=folder:{images}", f"--pretrained={pretrained}", f"--model_dir={model_dir}",
                   "--train_steps=6", "--skip_bad_images")
    assert result.returncode == 0, result.stderr[-3000:]
    # The recipe's defaults that cannot fit 28 images and 6 steps are adapted, each said in one line.
    assert "trainers.train: batch_size=16: the recipe's 512 is more than the 28 training images" in result.stdout
    assert "trainers.train: warmup_steps=0: the recipe's 500 is not fewer than train_steps=6" in result.stdout
    assert "trainers.train: eval_split='': " in result.stdout and "no 'validation' split" in result.stdout
    assert f"{bad} (class dog): cannot be decoded" in result.stderr
    assert "validation (no test split) top-1" in result.stdout
    assert "(3 examples, step 6, the final model)" in result.stdout
    metrics = json.loads((model_dir / "metrics.json").read_text())
    assert metrics["eval_split"].startswith("validation") and metrics["eval_examples"] == 3
    recipe = json.loads((model_dir / "recipe.json").read_text())
    assert recipe["batch_size"] == 16 and recipe["optimizer"] == "sgd"  # vit_finetune's, fitted
    # The checkpoint's architecture at its own image size, with the folder's classes. Read here: a fresh process
    # loading such a model.keras is test_docs.py's (README.md:45 fine-tunes from a folder, README.md:62 exports it).
    import keras

    import keras_vit  # noqa: F401 -- registers its layers for load_model

    config = keras.models.load_model(model_dir / "model.keras").vit_config
    assert (config.image_size, config.classes, config.patch_size, config.num_layers) == ((16, 16), 3, (4, 4), 1)


def test_training_and_validation_never_share_an_image_also_with_one_skipped(tmp_path):
    from trainers import data

    images = make_folder(tmp_path / "pets")
    bad = str(images / "train" / "owl" / "owl3.png")
    listed = folders.list_split(str(images), "train")
    train_files, held_files = folders.hold_out(listed, 0.2, seed=0)
    assert not set(train_files.paths) & set(held_files.paths)
    assert set(train_files.paths) | set(held_files.paths) == set(listed.paths)
    assert [held_files.counts()[label] for label in CLASSES] == [2, 2, 2]  # stratified
    pathlib.Path(bad).write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 40)  # undecodable
    source = data.load(f"folder:{images}", "train", skip_bad_images=True)
    assert source.skipped == 1
    train, validation = data.hold_out(source, 0.2, seed=0)

    def names(part, stream):
        return sorted(os.path.basename(name.decode()) for *_, name in getattr(part, stream).as_numpy_iterator())

    trained, validated = names(train, "named"), names(validation, "named")
    assert not set(trained) & set(validated) and "owl3.png" not in trained + validated
    assert len(trained) + len(validated) == 29
    # The hold-out is taken among the images the scan passed, by name: every class keeps its share.
    scanned = folders.hold_out(listed.keep(lambda path: path != bad), 0.2, seed=0)[1]
    assert set(validated) == {os.path.basename(p) for p in scanned.paths} and len(validated) == 6
    # The decoded streams hold those same images (the inception crop reads the named one).
    assert len(list(train.dataset)) == len(trained) and len(list(validation.dataset)) == len(validated)


def test_folder_slices_take_a_share_of_every_class_and_meet_nowhere(tmp_path):
    from trainers import data

    images = str(make_folder(tmp_path / "pets", per_class=10))
    head, tail = folders.list_split(images, "train[:80%]"), folders.list_split(images, "train[80%:]")
    assert [head.counts()[c] for c in CLASSES] == [8, 8, 8] and [tail.counts()[c] for c in CLASSES] == [2, 2, 2]
    assert not set(head.paths) & set(tail.paths) and len(head) + len(tail) == 30
    first, second = data.load(f"folder:{images}", "train[:80%]"), data.load(f"folder:{images}", "train[80%:]")
    data.check_disjoint(f"folder:{images}", "train[:80%]", first, "train[80%:]", second)
    overlapping = data.load(f"folder:{images}", "train[70%:]")
    with pytest.raises(ValueError, match=r"share examples \(.*pets/train/cat, records 7 to 7\)"):
        data.check_disjoint(f"folder:{images}", "train[:80%]", first, "train[70%:]", overlapping)
    with pytest.raises(ValueError, match=r"a slice of it in percent, such as 'train\[:80%\]'.*received 'train\[:8\]'"):
        folders.parse_split("train[:8]")


def test_layout_errors_name_what_was_expected_and_found(tmp_path):
    images = make_folder(tmp_path / "pets")
    too_deep = folders.layout_problem(str(images / "train"))
    assert "expected" in too_deep and "LABEL/IMAGE" in too_deep
    assert f"its folders cat, dog, owl hold images: it is a split, one level too deep. Pass its parent: " \
           f"--dataset=folder:{images}" in too_deep
    os.rename(images / "train", images / "photos")
    no_split = folders.layout_problem(str(images / "photos"))
    assert "hold images directly: they are classes without a split folder. Move them into" in no_split
    assert "no such directory" in folders.layout_problem(str(tmp_path / "nowhere"))


def test_a_class_without_training_images_is_refused(tmp_path):
    images = make_folder(tmp_path / "pets", per_class=3, splits=("train", "test"))
    for path in (images / "train" / "owl").iterdir():
        path.unlink()
    (images / "train" / "owl").rmdir()
    with pytest.raises(plan.Problems, match=r"has no image of class\(es\) \['owl'\] \(they are in another split\)"):
        plan.plan("digits", {"dataset": f"folder:{images}", "batch_size": 2, "image_size": 8})


def test_each_bad_model_field_is_named_not_only_the_first():
    """ViTConfig stops at its first bad field; the plan judges each model field alone first, so all are named."""
    with pytest.raises(plan.Problems) as refused:
        plan.plan("digits", {"norm_layer": "rmsnorm", "activation": "relu", "qkv_bias": True})
    named = str(refused.value)
    for field in ("norm_layer='rmsnorm'", "activation='relu'", "qkv_bias=True"):
        assert field in named, named


def test_every_problem_of_a_command_line_is_named_at_once_before_tensorflow(tmp_path):
    images = make_folder(tmp_path / "pets", per_class=3)
    probe = ("import sys; from absl import flags; from trainers import train; flags.FLAGS(sys.argv); "
             "assert 'tensorflow' not in sys.modules\n"
             "try:\n    train.check_flags(['train'])\nexcept ValueError as e:\n    print(len(e.problems)); print(e)\n"
             "assert 'tensorflow' not in sys.modules, 'TensorFlow was imported'")
    result = subprocess.run(
        [sys.executable, "-c", probe, "train", f"--dataset=folder:{images}", "--batch_size=64", "--learning_rate=-1",
         "--eval_split=test", "--warmup_steps=5000", "--num_heads=5", f"--model_dir={tmp_path / 'run'}"],
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    assert out.startswith("5\n"), out  # three flags, and two the folder refuses (test_journey below)
    assert "`learning_rate` must be in (0, inf); received learning_rate=-1.0" in out
    assert "`warmup_steps` must be fewer than the 4000 train_steps" in out
    assert "num_heads" in out and "received" in out
    assert not (tmp_path / "run").exists()
    # The data's problems once the flags are sound: a test split asked for and missing, a batch set too large.
    result = subprocess.run(
        [sys.executable, "-c", probe, "train", f"--dataset=folder:{images}", "--batch_size=64", "--eval_split=test",
         "--image_size=8", f"--model_dir={tmp_path / 'run'}"],
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("2\n"), result.stdout
    assert "split 'test' is not one of the splits of dataset 'folder:" in result.stdout
    assert "--eval_split='' to report the validation split" in result.stdout
    assert "`batch_size` must be <= the 6 training images" in result.stdout
    assert "received batch_size=64" in result.stdout


def test_the_trainer_prints_every_problem_one_line_each(tmp_path):
    result = train(f"--dataset=folder:{tmp_path / 'nowhere'}", "--batch_size=0", "--flip=maybe", timeout=120)
    assert result.returncode != 0
    result = train(f"--dataset=folder:{tmp_path / 'nowhere'}", "--batch_size=0", "--learning_rate=0",
                   f"--model_dir={tmp_path / 'run'}", timeout=120)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[0] == "trainers.train: 3 problems, nothing done:", result.stderr
    assert [line.startswith("  - ") for line in lines[1:4]] == [True] * 3
    assert "received batch_size=0" in result.stderr and "received learning_rate=0.0" in result.stderr
    assert f"dataset='folder:{tmp_path / 'nowhere'}': no such directory" in result.stderr


def test_a_recipe_default_is_adapted_and_a_value_set_is_refused(tmp_path):
    images = str(make_folder(tmp_path / "pets", per_class=4, splits=("train", "test")))
    fitted = plan.plan("vit_finetune", {"dataset": f"folder:{images}", "variant": "Ti/16", "pretrained": "",
                                        "image_size": 16, "patch_size": 4, "train_steps": 100})
    assert fitted.recipe.eval_split == "test" and fitted.recipe.batch_size == 8  # 12 images, 3 held out
    assert fitted.recipe.warmup_steps == round(100 * 500 / 20000)
    assert len(fitted.notes) == 3
    with pytest.raises(plan.Problems, match=r"`warmup_steps` must be fewer than the 100 train_steps"):
        plan.plan("vit_finetune", {"dataset": f"folder:{images}", "variant": "Ti/16", "pretrained": "",
                                   "image_size": 16, "patch_size": 4, "train_steps": 100, "warmup_steps": 100})
    digits_on_folder = plan.plan("digits", {"dataset": f"folder:{images}", "batch_size": 4})
    assert any("image_size=8x8 (the digits recipe's)" in note for note in digits_on_folder.notes)


def test_a_jpeg_cut_short_and_closed_again_is_named_by_the_folder_scan(tmp_path):
    """It decodes without error, half grey; libjpeg's anonymous warning was the only sign of it."""
    import tensorflow as tf

    from trainers import data

    images = make_folder(tmp_path / "pets", per_class=3)
    pixels = np.random.default_rng(3).integers(0, 256, (96, 96, 3), dtype=np.uint8)
    whole = tf.io.encode_jpeg(pixels).numpy()
    closed = whole[: len(whole) // 2] + b"\xff\xd9"
    tf.io.decode_jpeg(closed)  # the premise: no error
    path = images / "train" / "cat" / "closed.jpg"
    path.write_bytes(closed)
    with pytest.raises(ValueError, match=rf"(?s)1 of the images .*{path}: corrupt JPEG data \(libjpeg: premature end"):
        data.load(f"folder:{images}", "train")
    assert data.load(f"folder:{images}", "train", skip_bad_images=True).skipped == 1


def test_named_weights_out_of_reach_are_three_lines_without_a_traceback(tmp_path):
    from tests.processes import unreachable_network

    images = make_folder(tmp_path / "pets", per_class=3)
    env = unreachable_network({**ENV, "KERAS_HOME": str(tmp_path / "keras")})  # an empty cache, offline
    result = subprocess.run(
        [sys.executable, "-m", "trainers.train", f"--dataset=folder:{images}", "--variant=Ti/16",
         "--pretrained=augreg_in21k", f"--model_dir={tmp_path / 'run'}", "--train_steps=2"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("trainers.train:")]
    message = result.stderr[result.stderr.index(lines[0]):].strip().splitlines()
    assert len(message) <= 3, message
    assert "Could not download ViT-Ti/16:augreg_in21k from https://" in message[0]
    assert "--pretrained=PATH" in message[-1]
    assert not (tmp_path / "run").exists()


def test_a_class_whose_every_training_image_is_skipped_is_refused(tmp_path):
    """Else the model never sees the class: its test images all count wrong, with no word why."""
    from trainers import loop, recipes

    images = make_folder(tmp_path / "pets", per_class=3, splits=("train", "test"))
    for path in (images / "train" / "owl").iterdir():
        path.write_bytes(b"<html>404</html>")
    recipe = recipes.RECIPES["digits"].replace(dataset=f"folder:{images}", batch_size=2)
    with pytest.raises(ValueError, match=r"has no image of class\(es\) \['owl'\] once the undecodable ones are "
                                         r"skipped: the model would never learn them"):
        loop._load_sources(recipe, None, skip_bad_images=True)
