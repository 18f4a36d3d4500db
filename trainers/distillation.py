"""DeiT's distillation (Touvron et al., 2021, Sec. 4): a frozen teacher's output as the second target.

`Distiller` trains a keras_vit student on `(1 - alpha) * CE(class head, labels)
+ alpha * D(distillation head, teacher)`, where D is DeiT's hard distillation
(cross-entropy with the teacher's argmax) or soft distillation (tau^2 times
the KL divergence between the temperature-softened outputs). A student
without a distillation token gets both terms on its one head. The teacher
runs inside the compiled step on the student's (augmented, mixed) images,
frozen: it is not trainable and its output passes a stop-gradient.

The teacher is any Keras classifier: `keras.applications.NAME` (ImageNet
weights), a `.keras` file (a CNN saved with `model.save`, or a keras_vit
model) or a SavedModel directory (called through `keras.layers.TFSMLayer`).
It receives RGB pixels in [0, 255], the input of the `keras.applications`
models that carry their preprocessing (ConvNeXt, EfficientNet, MobileNetV3;
other families are refused by name); a keras_vit teacher gets its own
`preprocess_input` instead. Images are resized to a teacher's fixed input
size and grey ones repeated to 3 channels when the teacher takes RGB.
"""

import os

import keras
from keras import ops

from keras_vit.model import ViTModel, outputs_probabilities
from keras_vit.preprocessing import inputs_to_pixels, preprocess_input

KINDS = ("none", "hard", "soft")
TEACHER_OUTPUTS = ("auto", "logits", "probabilities")


@keras.saving.register_keras_serializable(package="keras_vit")
class HardDistillation(keras.losses.Loss):
    """Cross-entropy of the student's logits with the teacher's argmax: `(teacher_logits, student_logits)`."""

    def call(self, teacher_logits, student_logits):
        labels = ops.argmax(teacher_logits, axis=-1)
        return keras.losses.sparse_categorical_crossentropy(labels, student_logits, from_logits=True)


@keras.saving.register_keras_serializable(package="keras_vit")
class SoftDistillation(keras.losses.Loss):
    """`tau^2 * KL(softmax(teacher / tau) || softmax(student / tau))` per example (Hinton et al., 2015)."""

    def __init__(self, temperature=1.0, **kwargs):
        super().__init__(**kwargs)
        self.temperature = float(temperature)

    def call(self, teacher_logits, student_logits):
        teacher = ops.log_softmax(ops.cast(teacher_logits, "float32") / self.temperature, axis=-1)
        student = ops.log_softmax(ops.cast(student_logits, "float32") / self.temperature, axis=-1)
        return self.temperature**2 * ops.sum(ops.exp(teacher) * (teacher - student), axis=-1)

    def get_config(self):
        return {**super().get_config(), "temperature": self.temperature}


APPLICATIONS = "keras.applications."
# The keras.applications families that take [0, 255] pixels, their preprocessing inside the model.
PIXEL_FAMILIES = ("ConvNeXt", "EfficientNet", "MobileNetV3")


def check_teacher_name(spec):
    """Raises ValueError unless `spec` names a `keras.applications` model, a `.keras` file or a SavedModel."""
    if spec.startswith(APPLICATIONS):
        name = spec[len(APPLICATIONS):]
        if not callable(getattr(keras.applications, name, None)) or not name[:1].isupper():
            raise ValueError(f"`teacher`={spec!r} is not a keras.applications model (e.g. "
                             "keras.applications.ConvNeXtBase)")
        if not name.startswith(PIXEL_FAMILIES):
            raise ValueError(f"`teacher`={spec!r} takes its own preprocessed inputs, not [0, 255] pixels: use "
                             f"one of the {PIXEL_FAMILIES} families, or save the model behind its "
                             "preprocess_input as a .keras file")
    elif spec.endswith(".keras"):
        if not os.path.isfile(spec):
            raise ValueError(f"`teacher` must name an existing .keras file; received teacher={spec!r}: no such file")
    elif not os.path.isfile(os.path.join(spec, "saved_model.pb")):
        raise ValueError("`teacher` must be a .keras file, a SavedModel directory (with saved_model.pb) or "
                         f"keras.applications.NAME; received teacher={spec!r}")


def load_teacher(spec, signature="serving_default"):
    """The teacher model `spec` names: `keras.applications.NAME`, a `.keras` file or a SavedModel directory."""
    check_teacher_name(spec)
    if spec.startswith(APPLICATIONS):
        try:
            return getattr(keras.applications, spec[len(APPLICATIONS):])(weights="imagenet")
        except Exception as error:  # noqa: BLE001 -- urllib, OSError, Keras' own: all say "no weights"
            raise ValueError(
                f"Could not get the ImageNet weights of {spec} ({error}). Without a network, download them "
                "where Keras looks (~/.keras/models/, the file named in keras.applications' source), or save "
                "the model elsewhere with model.save('teacher.keras') and pass --teacher=teacher.keras") from error
    if spec.endswith(".keras"):
        return keras.models.load_model(spec, compile=False)
    if keras.backend.backend() != "tensorflow":  # TFSMLayer calls TensorFlow's graph inside the step
        raise ValueError(f"`teacher`={spec!r} is a SavedModel, which runs inside the training step on Keras' "
                         f"TensorFlow backend only; on {keras.backend.backend()} give a .keras file or "
                         "keras.applications.NAME")
    try:
        return keras.layers.TFSMLayer(spec, call_endpoint=signature, trainable=False)
    except ValueError as error:
        raise ValueError(f"`teacher_signature`={signature!r} is not a signature of the SavedModel {spec}: "
                         f"{error}") from error


class Teacher:
    """A frozen teacher adapted to the student: its inputs made from the student's, its output made logits."""

    def __init__(self, model, student_config, outputs="auto"):
        self.model = model
        self.model.trainable = False
        self.student_config = student_config
        self.input_shape = self._input_shape()
        self.probabilities = self._probabilities(outputs)

    def _input_shape(self):
        if isinstance(self.model, keras.layers.TFSMLayer):
            return (None, None, None)  # a SavedModel signature says nothing Keras can read here
        shape = self.model.input_shape
        return tuple(shape[0][1:] if isinstance(shape, list) else shape[1:])

    def _probabilities(self, outputs):
        if outputs != "auto":
            return outputs == "probabilities"
        if isinstance(self.model, keras.Model):
            return outputs_probabilities(self.model)
        return None  # a SavedModel's: read from its output's name on the first call

    def check(self, images, classes):
        """Runs the teacher on a batch; raises ValueError naming what does not fit the student's data."""
        channels = self.input_shape[-1]
        if channels not in (None, images.shape[-1]) and not (channels == 3 and images.shape[-1] == 1):
            raise ValueError(f"The teacher takes {channels} channels and the data has {images.shape[-1]}")
        logits = self.logits(images)
        if logits.shape[-1] != classes:
            raise ValueError(f"The teacher predicts {logits.shape[-1]} classes and the data has {classes}: "
                             "a teacher must be a classifier of the student's classes")

    def logits(self, images):
        """The teacher's logits (or log-probabilities) for student inputs `images`, without gradient."""
        outputs = self.model(self._inputs(images), training=False)
        if isinstance(outputs, dict):
            outputs = self._pick(outputs)
        elif self.probabilities is None:
            raise ValueError("The teacher's signature returns one unnamed output, which does not say whether it "
                             "is logits or probabilities: set --teacher_outputs")
        outputs = ops.cast(outputs, "float32")
        if self.probabilities:
            outputs = ops.log(ops.maximum(outputs, 1e-12))  # the log of a softmax is its logits, shifted
        return ops.stop_gradient(outputs)

    def _pick(self, outputs):
        """One output of a SavedModel signature's dict: the one `teacher_outputs` names, else the one its
        name says (`logits` first), else its only one."""
        named = [n for n in ("logits", "probabilities") if n in outputs]
        if self.probabilities is not None:
            wanted = "probabilities" if self.probabilities else "logits"
            if wanted in outputs:
                return outputs[wanted]
            if named:  # the signature names its output otherwise than the flag does
                raise ValueError(f"--teacher_outputs={wanted} but the teacher's signature returns {sorted(outputs)}: "
                                 f"set --teacher_outputs={named[0]}")
        elif named:
            self.probabilities = named[0] == "probabilities"
            return outputs[named[0]]
        if len(outputs) != 1:
            raise ValueError(f"The teacher's signature returns {sorted(outputs)}: it must return one output, "
                             "'logits' or 'probabilities'")
        if self.probabilities is None:
            raise ValueError(f"The teacher's output {next(iter(outputs))!r} does not say whether it is logits or "
                             "probabilities: set --teacher_outputs")
        return next(iter(outputs.values()))

    def _inputs(self, images):
        """Student inputs to the teacher's: [0, 255] pixels (or a keras_vit teacher's own inputs), resized, RGB."""
        pixels = inputs_to_pixels(images, self.student_config)
        height, width, channels = self.input_shape
        if height is not None and width is not None and tuple(pixels.shape[1:3]) != (height, width):
            pixels = ops.image.resize(pixels, (height, width), interpolation="bilinear")
        if channels == 3 and pixels.shape[-1] == 1:
            pixels = ops.repeat(pixels, 3, axis=-1)
        if isinstance(self.model, ViTModel) and self.model.vit_config is not None:
            return preprocess_input(pixels, config=self.model.vit_config)
        return pixels


class Distiller(keras.Model):
    """Trains `student` with `teacher` (a `Teacher`) as DeiT does; evaluates the student alone.

    Args:
        student: a keras_vit `ViTModel` with logits (`classifier_activation=None`), distilled or not.
        teacher: a `Teacher`.
        kind: "hard" or "soft".
        alpha: float in [0, 1]. Weight of the distillation term.
        temperature: float > 0. Soft distillation's tau.
    """

    def __init__(self, student, teacher, kind="hard", alpha=0.5, temperature=1.0, **kwargs):
        super().__init__(**kwargs)
        if kind not in ("hard", "soft"):
            raise ValueError(f"`kind` must be 'hard' or 'soft'; received kind={kind!r}")
        self.student, self.teacher, self.alpha = student, teacher, float(alpha)
        head_names = ("head", "head_dist") if student.vit_config.distilled else ("head",)
        self.heads = keras.Model(student.inputs, [student.get_layer(n).output for n in head_names])
        self.teacher_model = teacher.model  # tracked, so a strategy places its variables
        self.base_loss = keras.losses.CategoricalCrossentropy(from_logits=True)
        self.distillation_loss = HardDistillation() if kind == "hard" else SoftDistillation(temperature)

    def call(self, images, training=False):
        heads = self.heads(images, training=training)
        return tuple(heads) if isinstance(heads, (list, tuple)) else (heads, heads)

    @staticmethod
    def served(y_pred):
        """The student's output as it serves: its heads' logits averaged."""
        class_logits, distillation_logits = y_pred
        return (class_logits + distillation_logits) / 2

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        if not training:  # evaluation: the student as it serves, against the labels alone
            return self.base_loss(y, self.served(y_pred), sample_weight)
        class_logits, distillation_logits = y_pred
        distillation = self.distillation_loss(self.teacher.logits(x), distillation_logits, sample_weight)
        return (1 - self.alpha) * self.base_loss(y, class_logits, sample_weight) + self.alpha * distillation

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        return super().compute_metrics(x, y, self.served(y_pred), sample_weight)

    @property
    def checkpoint_variables(self):
        """What a training checkpoint holds: the student's variables, not the frozen teacher's."""
        return self.student.variables

    def deliverables(self):
        """The models written as model.keras and model.npz: the student."""
        return self.student, self.student
