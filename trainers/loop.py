"""The training run behind `python -m trainers.train`: the model, the fit loop, checkpoints and the final files.

`train(recipe, model_dir, strategy)` checkpoints every `checkpoint_every`
steps into `model_dir/checkpoints` and, started again with the same
arguments, resumes from the last checkpoint with its step, optimiser state,
schedule and data order. It evaluates a validation split held out of the
training data every `eval_every` steps (keeping the best checkpoint in
`model_dir/best`), reports the test split once from the final model, and writes
`model_dir/model.keras`, `model_dir/model.npz` (official format) and
`model_dir/metrics.json`. The recipe, the data and `model_dir` are checked
first (`validate_run`): a bad one stops the run before anything is written.
"""

import json
import math
import os
import pathlib
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import logging  # noqa: E402

import keras_vit  # noqa: E402
import keras_vit.mpp  # noqa: E402
from keras_vit.atomic_files import write_text_atomically  # noqa: E402
from keras_vit.fine_tuning import averaged_weights  # noqa: E402
from keras_vit.variants import variant_name  # noqa: E402
from trainers import data, distillation, mpp, optimization, recipes  # noqa: E402
from trainers.accumulation import accumulate_gradients  # noqa: E402
from trainers.checkpointing import open_checkpoints  # noqa: E402
from trainers.evaluation import BestCheckpoint, Evaluation, next_stop  # noqa: E402
from trainers.jax_distribution import KerasDistribution  # noqa: E402
from trainers.keras_workarounds import fit_multi_worker  # noqa: E402
from trainers.progress import RunProgress  # noqa: E402
from trainers.strategy import ACCELERATORS  # noqa: E402


def quiet_logs(verbosity_given):
    """Keeps INFO lines of absl, TFDS and TF's Python side out of the run's output unless --verbosity asks."""
    if verbosity_given:
        return
    import tensorflow_datasets as tfds

    logging.set_verbosity(logging.WARNING)
    tf.get_logger().setLevel("ERROR")
    tfds.disable_progress_bar()


def build_model(recipe, source):
    """The recipe's ViT for `source`'s channels and classes (pretrained weights loaded)."""
    weights = recipe.pretrained or None
    if weights:  # a pretrained name becomes its file's URL
        weights = keras_vit.checkpoints.resolve_weights(weights, variant_name(recipe.model)).location
    return keras_vit.ViT(recipe.model, input_shape=(*recipe.model.image_size, source.channels),
                         classes=source.num_classes, classifier_activation=None, weights=weights, name="vit")


def build_training_model(recipe, source):
    """The model `fit` trains: the recipe's ViT, its `Distiller` with the teacher, or the MPP network's task."""
    if recipe.task == "mpp":
        network = keras_vit.mpp.mpp_network(recipe.model, input_shape=(*recipe.model.image_size, source.channels),
                                            seed=recipe.seed, name="vit")
        return mpp.MaskedPatchPrediction(network)
    student = build_model(recipe, source)
    if recipe.distillation == "none":
        return student
    teacher = distillation.Teacher(distillation.load_teacher(recipe.teacher, recipe.teacher_signature),
                                   student.vit_config, recipe.teacher_outputs)
    images, _ = next(iter(data.eval_dataset(recipe, source, 2).take(1)))
    teacher.check(images, source.num_classes)
    return distillation.Distiller(student, teacher, recipe.distillation, recipe.distillation_alpha,
                                  recipe.distillation_temperature)


def _metrics(recipe):
    if recipe.task == "mpp":
        return mpp.metrics()
    return [keras.metrics.CategoricalAccuracy(name="top1"), keras.metrics.TopKCategoricalAccuracy(k=5, name="top5")]


def current_step(optimizer):
    """The optimiser's step counter as an int (a mirrored variable under tf.distribute)."""
    value = optimizer.iterations.value
    return int(tf.convert_to_tensor(value) if keras.backend.backend() == "tensorflow"
               else keras.ops.convert_to_numpy(value))


class StepLogger(keras.callbacks.Callback):
    """Stops on a NaN or infinite loss (naming the step) and logs images/s."""

    def __init__(self, batch_size, writer):
        super().__init__()
        self.batch_size = batch_size
        self.writer = writer

    def on_epoch_begin(self, epoch, logs=None):
        self.start_time = time.perf_counter()
        self.start_step = current_step(self.model.optimizer)

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            raise FloatingPointError(
                f"The training loss is {float(loss)} at step {current_step(self.model.optimizer)}; "
                "stopping. The last good checkpoint is kept.")

    def on_epoch_end(self, epoch, logs=None):
        steps = current_step(self.model.optimizer) - self.start_step
        rate = steps * self.batch_size / (time.perf_counter() - self.start_time)
        logs["images_per_second"] = rate
        with self.writer.as_default(step=current_step(self.model.optimizer)):
            tf.summary.scalar("images_per_second", rate)


def _is_chief(strategy):
    """The task that writes: "chief", or worker 0 when the cluster has no chief; JAX's process 0."""
    if isinstance(strategy, KerasDistribution):
        return strategy.is_chief
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.task_type:
        return True
    if resolver.task_type == "chief":
        return True
    return "chief" not in resolver.cluster_spec().jobs and (resolver.task_type, resolver.task_id) == ("worker", 0)


def _atomic_save_keras(model, path):
    """Saves the model without its training state, under a temporary name first.

    An uncompiled twin (same layers) is saved: the optimiser's schedule lives
    in `trainers`, and the file must load where only keras_vit is installed.
    """
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}.keras")
    keras_vit.ViTModel(model.inputs, model.outputs, name=model.name, vit_config=model.vit_config).save(tmp)
    os.replace(tmp, path)


# metrics.json's "eval_split" when the dataset has no test split.
VALIDATION_REPORTED = "validation (held out of the training split; no test split)"


class InvalidRun(ValueError):
    """A flag, field or datum that stops the run before its first step (nothing written)."""


def _load_sources(recipe, data_dir, skip_bad_images):
    train_source = data.load(recipe.dataset, recipe.train_split, data_dir, recipe.num_classes, skip_bad_images)
    eval_source = None  # no test split: the validation split held out of training is reported
    if recipe.eval_split:
        eval_source = data.load(recipe.dataset, recipe.eval_split, data_dir, recipe.num_classes, skip_bad_images)
        data.check_disjoint(recipe.dataset, recipe.train_split, train_source, recipe.eval_split, eval_source)
    for split, source in ((recipe.train_split, train_source), (recipe.eval_split, eval_source)):
        if source and source.skipped:
            logging.warning("%s", _skipped_message(source, split))
    if train_source.files is not None:  # a class with no image to learn from: never predicted, and no word of it
        empty = [name for name, count in _kept_counts(train_source).items() if not count]
        if empty:
            raise ValueError(f"The training split {recipe.train_split!r} of {recipe.dataset!r} has no image of "
                             f"class(es) {empty}{' once the undecodable ones are skipped' if train_source.bad else ''}"
                             f": the model would never learn them. Add images of them to the training split, or "
                             f"remove their folders")
    rgb_only = {name: getattr(recipe, name) for name in recipes.RGB_ONLY if getattr(recipe, name)}
    if rgb_only and train_source.channels != 3:
        raise ValueError(f"Model Garden's RandAugment, random erasing and Mixup/CutMix take RGB images; "
                         f"{recipe.dataset!r} has {train_source.channels} channel(s). Set these to 0: "
                         + ", ".join(f"--{name}={value}" for name, value in rgb_only.items()))
    if eval_source and not eval_source.num_examples:  # else the run would train to its end, then fail to evaluate
        raise ValueError(f"The evaluation split {recipe.eval_split!r} of {recipe.dataset!r} holds no examples; "
                         "point --eval_split at one that does")
    if train_source.num_examples < recipe.batch_size:
        raise ValueError(f"`batch_size` must be <= the {train_source.num_examples} training examples of "
                         f"{recipe.dataset!r} split {recipe.train_split!r}; received batch_size={recipe.batch_size}")
    return train_source, eval_source


def _kept_counts(source):
    """A folder source's images per class, less the skipped ones."""
    return source.files.keep(lambda path: path not in source.bad).counts()


def _skipped_message(source, split):
    """How many images of `split` --skip_bad_images leaves out; for a folder, the first 20 by name and class."""
    message = f"Skipped {source.skipped} undecodable images of split {split!r} (--skip_bad_images)"
    if not source.bad:
        return message
    classes = dict(zip(source.files.paths, (source.files.classes[label] for label in source.files.labels),
                       strict=True))
    listed = "".join(f"\n  {path} (class {classes[path]}): {reason}" for path, reason in list(source.bad.items())[:20])
    more = f"\n  ... and {len(source.bad) - 20} more" if len(source.bad) > 20 else ""
    return f"{message}:{listed}{more}"


def validate_run(recipe, model_dir, strategy, data_dir, skip_bad_images, eval_every):
    """Every check that needs no model, cheapest first; returns the opened (train, eval) sources.

    Raises InvalidRun naming the flag, the value and what is allowed. Reads
    only: model_dir is neither created nor written.
    """
    try:
        recipes.validate(recipe)
        recipes.check_eval_every(eval_every, recipe)
        recipes.check_replicas(recipe, strategy.num_replicas_in_sync)
        recipes.check_model_dir(model_dir, recipe)
        train_source, eval_source = _load_sources(recipe, data_dir, skip_bad_images)
        train_source, validation_source = _hold_out(recipe, train_source)
        return train_source, validation_source, eval_source
    except ValueError as error:
        raise InvalidRun(str(error)) from error


def _hold_out(recipe, train_source):
    """`(train, validation)`: the recipe's validation_fraction of its training split held out (None if 0)."""
    if not recipe.validation_fraction:
        return train_source, None
    train_source, validation_source = data.hold_out(train_source, recipe.validation_fraction, recipe.seed)
    if not validation_source.num_examples:
        raise ValueError(f"validation_fraction={recipe.validation_fraction} of the {train_source.num_examples} "
                         f"training examples of {recipe.dataset!r} holds out none; raise it, or set 0")
    if train_source.num_examples < recipe.batch_size:
        raise ValueError(f"`batch_size` must be <= the {train_source.num_examples} training examples left after "
                         f"validation_fraction={recipe.validation_fraction}; received batch_size={recipe.batch_size}")
    return train_source, validation_source


def train(recipe, model_dir, strategy, kind="cpu", data_dir=None, skip_bad_images=False, eval_every=None):
    """Trains `recipe` in `model_dir` under `strategy`; returns `(model, metrics)`.

    Everything that can be wrong with the recipe, the data or the model
    directory raises InvalidRun before the first step and before anything is
    written to `model_dir`. `eval_every` steps (default: at every checkpoint;
    0: at the end only) it evaluates and keeps the best checkpoint in
    `model_dir/best` beside the last ones in `model_dir/checkpoints`.
    """
    model_dir = pathlib.Path(model_dir)
    eval_every = recipes.default_eval_every(recipe) if eval_every is None else eval_every
    train_source, validation_source, eval_source = validate_run(recipe, model_dir, strategy, data_dir,
                                                                skip_bad_images, eval_every)
    model, optimizer = _set_up_model(recipe, strategy, kind, train_source, eval_source)
    is_chief = _is_chief(strategy)
    open_in, checkpoints, resumed_from = _restore_checkpoint(model, optimizer, model_dir, strategy, is_chief)

    # Validation and the restore succeeded: from here on the run may write.
    model_dir.mkdir(parents=True, exist_ok=True)
    if is_chief:
        write_text_atomically(model_dir / "recipe.json", recipe.to_json())
    progress = RunProgress(recipe.train_steps, recipe.batch_size)
    if resumed_from:
        progress.message(f"Resumed from {resumed_from} at step {current_step(optimizer)}")
    callbacks = _callbacks(recipe, model_dir, is_chief, progress)
    # Model selection (best/) on the validation split held out of the training data; the test split is
    # evaluated once, by the final model, so the figure reported is not the one that chose.
    best = validation_source and BestCheckpoint(
        open_in(model_dir / _scratch_name(strategy, is_chief, "best")), model_dir, is_chief)
    validate = validation_source and Evaluation(
        model, data.eval_dataset(recipe, validation_source, recipe.batch_size), model_dir / "logs" / "validation",
        is_chief)
    step = current_step(optimizer)
    # Evaluations, best/ and the files take the weight average where the recipe keeps one; the checkpoints in
    # checkpoints/ keep the trained weights (and the average, an optimiser variable), so a resumed run goes on.
    if best and resumed_from and _evaluates_at(step, recipe, eval_every) and best.last_evaluated_step < step:
        with averaged_weights(model, optimizer):  # the run stopped between this checkpoint and its evaluation
            progress.message(best.consider(step, validate(step)))
    for step in _fit_in_chunks(model, optimizer, recipe, train_source, eval_every, callbacks):
        if step % recipe.checkpoint_every == 0 or step == recipe.train_steps:
            checkpoints.save(step)
        if best and _evaluates_at(step, recipe, eval_every):
            with averaged_weights(model, optimizer):
                progress.message(best.consider(step, validate(step)))

    step = current_step(optimizer)
    with averaged_weights(model, optimizer):
        metrics = _final_report(recipe, model, model_dir, step, best, validate, validation_source, eval_source,
                                is_chief, progress)
        metrics.update(backend=keras.backend.backend(), devices=_devices(strategy))
        _finish(model, model_dir, metrics, is_chief, checkpoints, best,
                train_source.class_names if recipe.task == "classification" else None)
    return model, metrics


def _final_report(recipe, model, model_dir, step, best, validate, validation_source, eval_source, is_chief,
                  progress):
    """The final model's evaluations (best/ considered once more): metrics.json's fields."""
    validated = validate(step) if best else None
    if best:
        progress.message(best.consider(step, validated))
    # With no test split the final report is the validation split's, said so in "eval_split".
    results = validated if eval_source is None else Evaluation(
        model, data.eval_dataset(recipe, eval_source, recipe.batch_size), model_dir / "logs" / "test", is_chief)(step)
    reported = eval_source or validation_source
    return {"step": step, "eval_split": recipe.eval_split or VALIDATION_REPORTED, "eval_loss": results["loss"],
            "eval_top1": results["top1"], "eval_top5": results["top5"], "eval_examples": reported.num_examples,
            "validation_examples": validation_source.num_examples if best else 0,
            "validation_top1": validated["top1"] if best else None,
            "best_step": best.record["step"] if best else None,
            "best_top1": best.record["eval_top1"] if best else None}


def _devices(strategy):
    """The devices the run's steps ran on, over every host."""
    if isinstance(strategy, KerasDistribution):
        return strategy.num_devices
    return strategy.num_replicas_in_sync  # tf.distribute: one replica per device (a TPU core)


def _evaluates_at(step, recipe, eval_every):
    """Whether the run evaluates at `step` between chunks (the last step's evaluation comes after the loop)."""
    return bool(eval_every) and step % eval_every == 0 and 0 < step < recipe.train_steps


def _set_up_model(recipe, strategy, kind, train_source, eval_source):
    """Sets the precision policy and the seed, then builds and compiles the model; returns `(model, optimizer)`.

    Raises InvalidRun when the architecture's own checks refuse the recipe.
    """
    policy = recipe.mixed_precision
    if policy == "auto":
        policy = "bfloat16" if kind in ACCELERATORS else "float32"
    keras.mixed_precision.set_global_policy("mixed_bfloat16" if policy == "bfloat16" else "float32")
    steps_per_execution, jit_compile = _execution_settings(recipe, strategy, kind)
    # Seeded after the data is opened: preparing a TFDS dataset draws random numbers.
    keras.utils.set_random_seed(recipe.seed)
    with strategy.scope():
        try:  # the architecture's own checks (patch size dividing the image, heads the width, ...), the teacher's
            model = build_training_model(recipe, train_source)
        except ValueError as error:
            if isinstance(error, OSError):  # weights out of reach: their own short message
                raise
            raise InvalidRun(str(error)) from error
        optimizer = optimization.make_optimizer(recipe, model)
        model.compile(
            optimizer=optimizer,
            # A Distiller or an MPP task computes its own loss.
            loss=keras.losses.CategoricalCrossentropy(from_logits=True) if isinstance(model, keras_vit.ViTModel)
            else None,
            metrics=_metrics(recipe),
            jit_compile=jit_compile,
            steps_per_execution=steps_per_execution,
        )
        optimizer.build(model.trainable_variables)
        accumulate_gradients(model, recipe.grad_accumulation_steps)
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        fit_multi_worker(model, data.eval_dataset(recipe, eval_source or train_source, recipe.batch_size), strategy)
    return model, optimizer


def _execution_settings(recipe, strategy, kind):
    """The recipe's `(steps_per_execution, jit_compile)` on `kind`, less what Keras 3 cannot run under `strategy`."""
    if isinstance(strategy, KerasDistribution):
        # JAX compiles its step on every device, the CPU too; "false" runs it op by op (for debugging).
        return recipe.steps_per_execution, recipe.jit_compile != "false"
    steps_per_execution = recipe.steps_per_execution
    mirrored = isinstance(strategy, (tf.distribute.MultiWorkerMirroredStrategy, tf.distribute.MirroredStrategy))
    if mirrored and steps_per_execution > 1:
        # Keras 3.15's multi-step loop fails under (multi-worker) mirrored
        # strategies: "You must feed a value for placeholder tensor" (BUILD.md).
        logging.warning("steps_per_execution=1 under %s (Keras 3.15)", type(strategy).__name__)
        steps_per_execution = 1
    # On the CPU XLA's first training step is much longer than the TF graph's, for steady steps no faster
    # (BUILD.md): "auto" leaves it to TPUs and GPUs, as Keras' own "auto" does.
    jit_compile = {"true": True, "false": False}.get(recipe.jit_compile, kind in ACCELERATORS)
    if mirrored and jit_compile and strategy.num_replicas_in_sync > 1:
        # Keras 3 compiles the whole replicated step as one XLA cluster, which cannot
        # read variables kept on several devices ("Trying to access resource ... located
        # in device CPU:1 from device CPU:0"); TPUStrategy compiles per replica (BUILD.md).
        logging.warning("XLA off under %s with %d replicas (Keras 3)", type(strategy).__name__,
                        strategy.num_replicas_in_sync)
        jit_compile = False
    return steps_per_execution, jit_compile


def _scratch_name(strategy, is_chief, name):
    """Where this process saves its copy of `name` (checkpoints, best): every tf.distribute worker takes part in a
    save, and only the chief's lands in `name`; the others write a scratch directory. (JAX runs one host.)"""
    return name if is_chief else f"{name}_{strategy.cluster_resolver.task_id}"


def _restore_checkpoint(model, optimizer, model_dir, strategy, is_chief):
    """Restores the last checkpoint if there is one; returns `(open_in, checkpoints, resumed_from)`.

    `open_in(directory)` opens the run's checkpoints in another directory (best/). Writes nothing. Raises
    InvalidRun when that checkpoint does not fit the recipe's model.
    """
    # Variables by position: weights, seed-generator states, optimiser slots and step.
    # (A Distiller's teacher is not in it: it is frozen and loaded again.)
    variables = getattr(model, "checkpoint_variables", model.variables)

    def open_in(directory):
        return open_checkpoints(list(variables), list(optimizer.variables), directory, max_to_keep=2)

    checkpoints = open_in(model_dir / _scratch_name(strategy, is_chief, "checkpoints"))
    resumed_from = checkpoints.latest
    if resumed_from:
        try:
            checkpoints.restore_latest()
        except ValueError as error:
            raise InvalidRun(f"{resumed_from} does not restore into this recipe's model: {error}") from error
    return open_in, checkpoints, resumed_from


def _callbacks(recipe, model_dir, is_chief, progress):
    """The loss check and images/s, `progress`, and on the chief the TensorBoard logs in `model_dir/logs`."""
    writer = (tf.summary.create_file_writer(str(model_dir / "logs" / "train")) if is_chief
              else tf.summary.create_noop_writer())
    callbacks = [StepLogger(recipe.batch_size, writer), progress]
    if is_chief:
        callbacks.append(keras.callbacks.TensorBoard(str(model_dir / "logs"), update_freq="epoch"))
    return callbacks


def _fit_in_chunks(model, optimizer, recipe, train_source, eval_every, callbacks):
    """Fits from the optimiser's step to `train_steps` in chunks that end at each checkpoint or evaluation.

    Yields the step each chunk ends at, so the caller checkpoints and evaluates between chunks.
    """
    step = current_step(optimizer)
    while step < recipe.train_steps:
        stop = next_stop(step, recipe, eval_every)
        stream = data.train_dataset(recipe, train_source, recipe.batch_size, step, stop - step)
        with warnings.catch_warnings():
            if train_source.skip_bad_images:  # its stream's length is unknown, so Keras' last block may end short
                warnings.filterwarnings("ignore", message="Your input ran out of data", category=UserWarning)
            # One Keras "epoch" per chunk, numbered by its first step, so TensorBoard's x axis is the step.
            model.fit(stream, steps_per_epoch=stop - step, initial_epoch=step, epochs=step + 1,
                      callbacks=callbacks, verbose=0, shuffle=False)
        step = current_step(optimizer)
        yield step


def _finish(model, model_dir, metrics, is_chief, checkpoints, best, class_names=None):
    """The chief writes model.keras, model.npz, metrics.json and labels.txt (the class names, where the dataset
    has them: what `python -m export --labels` takes); the other workers remove their scratch copies."""
    if not is_chief:  # a TF worker's scratch copies (checkpoints_N, best_N)
        tf.io.gfile.rmtree(str(checkpoints.directory))
        if best:
            tf.io.gfile.rmtree(str(best.checkpoints.directory))
        return
    # The ViT itself; a Distiller's student; the MPP network and its headless backbone.
    keras_model, npz_model = model.deliverables() if hasattr(model, "deliverables") else (model, model)
    _atomic_save_keras(keras_model, model_dir / "model.keras")
    keras_vit.save_npz(npz_model, model_dir / "model.npz")
    write_text_atomically(model_dir / "metrics.json", json.dumps(metrics, indent=2))
    if class_names and all(name and "\n" not in name for name in class_names):
        write_text_atomically(model_dir / "labels.txt", "".join(f"{name}\n" for name in class_names))
