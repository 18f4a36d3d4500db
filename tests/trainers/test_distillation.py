"""DeiT distillation: the losses against hand-computed values, the frozen teacher, its inputs, its file kinds."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_vit
from trainers import distillation, recipes
from trainers.train import resolve_recipe

STUDENT = dict(patch_size=2, hidden_size=16, mlp_dim=32, num_heads=2, num_layers=1, image_size=8, classes=3,
               classifier="token")


def _log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def test_hard_distillation_is_cross_entropy_with_the_teachers_argmax():
    teacher = np.array([[1.0, 3.0, 2.0], [0.0, -1.0, 5.0]], "float32")
    student = np.array([[0.5, 0.2, 0.1], [2.0, 1.0, 0.0]], "float32")
    expected = -(_log_softmax(student)[0, 1] + _log_softmax(student)[1, 2]) / 2
    assert float(distillation.HardDistillation()(teacher, student)) == pytest.approx(expected, rel=1e-6)


def test_soft_distillation_is_tau_squared_kl_of_the_softened_outputs():
    teacher = np.array([[1.0, 3.0, 2.0], [0.0, -1.0, 5.0]], "float32")
    student = np.array([[0.5, 0.2, 0.1], [2.0, 1.0, 0.0]], "float32")
    tau = 3.0
    log_t, log_s = _log_softmax(teacher / tau), _log_softmax(student / tau)
    expected = tau**2 * (np.exp(log_t) * (log_t - log_s)).sum(-1).mean()
    assert float(distillation.SoftDistillation(tau)(teacher, student)) == pytest.approx(expected, rel=1e-5)
    assert float(distillation.SoftDistillation(tau)(teacher, teacher)) == pytest.approx(0.0, abs=1e-6)


def _teacher_model(softmax=False, channels=1, size=8):
    keras.utils.set_random_seed(5)
    return keras.Sequential([keras.Input((size, size, channels)), keras.layers.Rescaling(1 / 255),
                             keras.layers.Flatten(), keras.layers.Dense(3, activation="softmax" if softmax else None)])


def _distiller(kind="hard", distilled=True, alpha=0.5, teacher=None):
    student = keras_vit.ViT(input_shape=(8, 8, 1), classifier_activation=None, distilled=distilled, **STUDENT)
    teacher = distillation.Teacher(teacher or _teacher_model(), student.vit_config)
    return distillation.Distiller(student, teacher, kind, alpha, temperature=2.0), student, teacher


@pytest.mark.parametrize("kind", ["hard", "soft"])
@pytest.mark.parametrize("distilled", [True, False])
def test_the_training_loss_weighs_labels_and_teacher(kind, distilled):
    distiller, student, teacher = _distiller(kind, distilled, alpha=0.3)
    for layer in ("head", "head_dist") if distilled else ("head",):  # heads that differ from each other
        for w in student.get_layer(layer).weights:
            w.assign(np.random.default_rng(len(layer)).normal(size=w.shape).astype("float32"))
    x = np.random.default_rng(0).uniform(-1, 1, (4, 8, 8, 1)).astype("float32")
    y = np.eye(3, dtype="float32")[[0, 1, 2, 1]]
    class_logits, distillation_logits = (np.asarray(t) for t in distiller(x))
    if not distilled:  # one head takes both terms
        np.testing.assert_array_equal(class_logits, distillation_logits)
    teacher_logits = np.asarray(teacher.model((x * 0.5 + 0.5) * 255.0))
    base = -(y * _log_softmax(class_logits)).sum(-1).mean()
    if kind == "hard":
        term = -_log_softmax(distillation_logits)[np.arange(4), teacher_logits.argmax(-1)].mean()
    else:
        log_t, log_s = _log_softmax(teacher_logits / 2), _log_softmax(distillation_logits / 2)
        term = 4 * (np.exp(log_t) * (log_t - log_s)).sum(-1).mean()
    loss = distiller.compute_loss(x, y, distiller(x), training=True)
    assert float(loss) == pytest.approx(0.7 * base + 0.3 * term, rel=1e-5)
    # Evaluation: the student as it serves, its heads averaged, against the labels alone.
    average = (class_logits + distillation_logits) / 2
    np.testing.assert_allclose(np.asarray(student(x)), average, rtol=1e-5, atol=1e-6)
    eval_loss = distiller.compute_loss(x, y, distiller(x), training=False)
    assert float(eval_loss) == pytest.approx(-(y * _log_softmax(average)).sum(-1).mean(), rel=1e-5)


def test_the_teacher_gets_no_gradient_and_stays_as_it_was():
    distiller, student, teacher = _distiller("soft")
    assert not teacher.model.trainable_weights
    assert {id(v) for v in distiller.trainable_variables} == {id(v) for v in student.trainable_variables}
    x = np.random.default_rng(0).uniform(-1, 1, (8, 8, 8, 1)).astype("float32")
    y = np.eye(3, dtype="float32")[np.arange(8) % 3]
    with tf.GradientTape() as tape:
        tape.watch(teacher.model.weights[0].value)
        loss = distiller.compute_loss(x, y, distiller(x, training=True), training=True)
    assert tape.gradient(loss, teacher.model.weights[0].value) is None
    before_teacher = [w.numpy() for w in teacher.model.weights]
    before_student = [w.numpy() for w in student.trainable_weights]
    distiller.compile(keras.optimizers.SGD(0.5), metrics=[keras.metrics.CategoricalAccuracy(name="top1")])
    distiller.fit(x, y, batch_size=4, epochs=2, verbose=0)
    for before, w in zip(before_teacher, teacher.model.weights, strict=True):
        np.testing.assert_array_equal(before, w.numpy())
    assert any(not np.array_equal(b, w.numpy()) for b, w in zip(before_student, student.trainable_weights, strict=True))
    assert [v.name for v in distiller.checkpoint_variables] == [v.name for v in student.variables]


def test_the_teacher_gets_pixels_resized_and_in_rgb_or_a_vits_own_inputs():
    student = keras_vit.ViT(input_shape=(8, 8, 1), classifier_activation=None, **STUDENT)
    x = np.random.default_rng(0).uniform(-1, 1, (2, 8, 8, 1)).astype("float32")
    pixels = (x * 0.5 + 0.5) * 255.0
    rgb = distillation.Teacher(_teacher_model(channels=3, size=16), student.vit_config)
    expected = np.repeat(np.asarray(keras.ops.image.resize(pixels, (16, 16))), 3, axis=-1)
    np.testing.assert_allclose(np.asarray(rgb._inputs(x)), expected, rtol=1e-5, atol=1e-3)
    vit_teacher = keras_vit.ViT(input_shape=(8, 8, 1), channels=1, input_mean=(0.2,), input_std=(0.4,), **STUDENT)
    teacher = distillation.Teacher(vit_teacher, student.vit_config)
    np.testing.assert_allclose(np.asarray(teacher._inputs(x)), (pixels / 255 - 0.2) / 0.4, rtol=1e-5, atol=1e-5)
    assert teacher.probabilities  # a ViT with its softmax head


def test_a_softmax_teacher_is_read_as_log_probabilities():
    student = keras_vit.ViT(input_shape=(8, 8, 1), classifier_activation=None, **STUDENT)
    model = _teacher_model(softmax=True)
    teacher = distillation.Teacher(model, student.vit_config)
    x = np.random.default_rng(0).uniform(-1, 1, (2, 8, 8, 1)).astype("float32")
    np.testing.assert_allclose(np.asarray(teacher.logits(x)), np.log(np.asarray(model((x * 0.5 + 0.5) * 255))),
                               rtol=1e-5)
    assert not distillation.Teacher(_teacher_model(), student.vit_config).probabilities


def test_a_savedmodel_teacher_is_called_through_its_signature(tmp_path):
    model = _teacher_model()
    model.export(str(tmp_path / "teacher"), verbose=False)
    student = keras_vit.ViT(input_shape=(8, 8, 1), classifier_activation=None, **STUDENT)
    x = np.random.default_rng(0).uniform(-1, 1, (2, 8, 8, 1)).astype("float32")
    layer = distillation.load_teacher(str(tmp_path / "teacher"), "serve")
    with pytest.raises(ValueError, match="does not say whether it is logits or probabilities: set --teacher_outputs"):
        distillation.Teacher(layer, student.vit_config).logits(x)
    teacher = distillation.Teacher(layer, student.vit_config, outputs="logits")
    np.testing.assert_allclose(np.asarray(teacher.logits(x)), np.asarray(model((x * 0.5 + 0.5) * 255)), rtol=1e-5)
    with pytest.raises(ValueError, match="'nope' is not a signature"):
        distillation.load_teacher(str(tmp_path / "teacher"), "nope")


def test_a_teacher_returning_both_outputs_gives_the_one_asked_for():
    base = _teacher_model()
    images = keras.Input((8, 8, 1))
    logits = base(images)
    both = keras.Model(images, {"logits": logits, "probabilities": keras.layers.Softmax()(logits)})
    only_logits = keras.Model(images, {"logits": logits})
    student = keras_vit.ViT(input_shape=(8, 8, 1), classifier_activation=None, **STUDENT)
    x = np.random.default_rng(0).uniform(-1, 1, (2, 8, 8, 1)).astype("float32")
    expected = np.asarray(base((x * 0.5 + 0.5) * 255))
    for outputs in ("auto", "logits", "probabilities"):  # log-probabilities are the logits, shifted per row
        got = np.asarray(distillation.Teacher(both, student.vit_config, outputs).logits(x))
        np.testing.assert_allclose(got - got.max(1, keepdims=True), expected - expected.max(1, keepdims=True),
                                   atol=1e-5, err_msg=outputs)
    with pytest.raises(ValueError,
                       match=r"--teacher_outputs=probabilities but .* \['logits'\]: set --teacher_outputs=logits"):
        distillation.Teacher(only_logits, student.vit_config, "probabilities").logits(x)


def test_a_teacher_that_does_not_fit_the_data_is_refused():
    student = keras_vit.ViT(input_shape=(8, 8, 1), classifier_activation=None, **STUDENT)
    images = np.zeros((2, 8, 8, 1), "float32")
    with pytest.raises(ValueError, match="The teacher predicts 3 classes and the data has 10"):
        distillation.Teacher(_teacher_model(), student.vit_config).check(images, 10)
    with pytest.raises(ValueError, match="The teacher takes 2 channels and the data has 1"):
        distillation.Teacher(_teacher_model(channels=2), student.vit_config).check(images, 3)


@pytest.mark.parametrize("fields, message", [
    (dict(distillation="hard"), r"distillation='hard' needs a `teacher`"),
    (dict(teacher="t.keras"), "`teacher` is set but distillation='none'"),
    (dict(distillation="soft", teacher="missing.keras"), "received teacher='missing.keras': no such file"),
    (dict(distillation="soft", teacher="keras.applications.NoSuchNet"), "is not a keras.applications model"),
    (dict(distillation="soft", teacher="keras.applications.ResNet50"), "takes its own preprocessed inputs"),
    (dict(distillation="soft", teacher="a_directory"), "must be a .keras file, a SavedModel directory"),
    (dict(distillation="soft", teacher="keras.applications.ConvNeXtTiny", distillation_temperature=0.0),
     r"`distillation_temperature` must be in \(0, inf\)"),
    (dict(distillation="hard", teacher="keras.applications.ConvNeXtTiny", distillation_alpha=1.5),
     r"`distillation_alpha` must be in \[0, 1\]"),
    (dict(task="mpp", distillation="hard", teacher="keras.applications.ConvNeXtTiny"),
     "task='mpp' pre-trains a plain ViT from scratch: it needs distillation='none'"),
    (dict(task="mpp", resnet_num_layers=(1,)), "it needs resnet_num_layers=None"),
    (dict(task="masked"), r"`task` must be one of \('classification', 'mpp'\)"),
])
def test_bad_task_fields_are_refused_before_the_run(fields, message):
    with pytest.raises(ValueError, match=message):
        resolve_recipe("digits", fields)


def test_the_distilled_recipe_names_deits_teacher():
    recipe = recipes.validate(recipes.RECIPES["deit_distilled"])
    assert (recipe.distillation, recipe.teacher, recipe.distillation_alpha, recipe.model.distilled) == (
        "hard", "keras.applications.ConvNeXtBase", 0.5, True)


def test_an_unreachable_applications_download_says_what_to_do(monkeypatch):
    def offline(**kwargs):
        raise OSError("URL fetch failure on https://storage.googleapis.com/...: [Errno -3] name resolution")

    monkeypatch.setattr(keras.applications, "ConvNeXtTiny", offline)
    with pytest.raises(ValueError, match=r"(?s)Could not get the ImageNet weights of keras.applications.ConvNeXtTiny"
                                         r".*~/.keras/models/.*--teacher=teacher.keras"):
        distillation.load_teacher("keras.applications.ConvNeXtTiny")
