"""keras_vit's checks on one Keras backend; tests/backends/test_backends.py compares their results.

    KERAS_BACKEND=jax|torch python -m tests.backends.backend_checks OUT_DIR [--load-only]

On JAX and PyTorch the process runs with TensorFlow unimportable, as in an
environment without it. It writes `OUT_DIR/<backend>.npz`: the logits of every
golden fixture (official `.npz` and timm safetensors, through the public
`from_checkpoint`), the losses of a few training steps, the analysis API's
results, whether an official `.npz` written by `save_npz` loads back bit for
bit, resized pixels (`keras_vit.resize_and_center_crop`, `resize_pixels`), the
pixels `keras_vit.explain` reads from a PNG and (off TensorFlow) the figures it
writes, the refusals of inputs of the wrong shape, PatchDropout's kept tokens, and
whether TensorFlow was imported; it saves `OUT_DIR/<backend>_<encoder>.keras`
(unrolled and scanned encoders, each renamed into place once whole) with their outputs, then waits for every other
backend's files and loads them (`loaded_<saver>_<encoder>` outputs). The three backends run at once, each
in its own process (TensorFlow in the test's): one that fails leaves `OUT_DIR/<backend>.failed`, and the others stop
waiting. The TensorFlow backend runs the same functions in the test process (`run`, `wait_for_keras_files`,
`load_keras_files`).
"""

import os
import sys

if __name__ == "__main__" and os.environ.get("KERAS_BACKEND") in ("jax", "torch"):
    # As if TensorFlow were not installed: `import tensorflow` raises ModuleNotFoundError and
    # `importlib.util.find_spec` (which PyTorch's compiler asks) says it is absent.
    sys.modules["tensorflow"] = None

import json  # noqa: E402
import pathlib  # noqa: E402
import time  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_vit  # noqa: E402
from tests import fine_tuning_checks  # noqa: E402

FIXTURES = pathlib.Path(__file__).parents[1] / "fixtures"
# Official-format cases and what from_checkpoint needs beyond the file: every case but `bicubic`, whose
# weights are `resize`'s byte for byte (the resize methods are tested on TensorFlow in
# tests/checkpoints/test_official.py).
OFFICIAL_CASES = {"token": {}, "gap": {}, "representation": {}, "rectangular": {"image_size": (32, 48)},
                  "hybrid": {}, "resize": {"image_size": 48}}
# Official cases also loaded with scan_layers=True.
SCANNED_CASES = ("token", "gap")
# timm cases: the path under fixtures/timm (`bare` is a lone file without config.json).
TIMM_CASES = {case: case for case in ("augreg", "deit", "deit_distilled", "gap_fc_norm", "gap_no_token",
                                      "no_embed_class", "orig_in21k")} | {"bare": "bare/weights.safetensors"}
# Issue 41's kinds: (path under fixtures, its io file, the io key of the reference's outputs); inputs normalised.
EXTRA_CASES = {
    "hf_vit": ("hf/vit_classifier", "hf/vit_classifier_io.npz", "outputs"),
    "hf_deit": ("hf/deit_teacher", "hf/deit_teacher_io.npz", "outputs"),
    "bv_map": ("timm_extra/bv_map.npz", "timm_extra/bv_map_io.npz", "logits"),
    "bv_map_scan": ("timm_extra/bv_map_scan.npz", "timm_extra/bv_map_scan_io.npz", "logits"),
    "map_reg": ("timm_extra/map_reg", "timm_extra/map_reg_io.npz", "logits"),
    "reg4_gap": ("timm_extra/reg4_gap", "timm_extra/reg4_gap_io.npz", "logits"),
    # transformers' CLIPVisionModelWithProjection: norm_pre, QuickGELU, fc_norm, projection, no patch bias.
    "hf_clip_projection": ("families/hf_clip_projection", "families/hf_clip_projection_io.npz", "image_embeds"),
    # Every block of the later families once: timm's AIMv2 (RMSNorm, patch norm, split SwiGLU, no biases), DINOv2
    # giant (LayerScale, SwiGLUPacked), DeiT III, CLIP with QuickGELU, q/k norm; transformers' DINOv2 with
    # registers (class row folded, antialiased resize) and SigLIP (MAP head).
    "timm_aimv2": ("families/timm_aimv2", "families/timm_aimv2_io.npz", "outputs"),
    "timm_dinov2_swiglu": ("families/timm_dinov2_swiglu", "families/timm_dinov2_swiglu_io.npz", "outputs"),
    "timm_deit3": ("families/timm_deit3", "families/timm_deit3_io.npz", "outputs"),
    "timm_clip_quickgelu": ("families/timm_clip_quickgelu", "families/timm_clip_quickgelu_io.npz", "outputs"),
    "timm_qk_norm": ("families/timm_qk_norm", "families/timm_qk_norm_io.npz", "outputs"),
    "hf_dinov2_registers": ("families/hf_dinov2_registers", "families/hf_dinov2_registers_io.npz", "pooler_output"),
    "hf_siglip_vision": ("families/hf_siglip_vision", "families/hf_siglip_vision_io.npz", "pooler_output"),
    # Issue 51's rotary families, every fixture: timm's EVA02, DINOv3, RoPE-ViT and SBB, transformers' DINOv3.
    **{case: (f"rope/{case}", f"rope/{case}_io.npz", "pooler_output" if case.startswith("hf_") else "outputs")
       for case in ("timm_eva02_tiny", "timm_eva02_base", "timm_eva02_clip", "timm_dinov3", "timm_dinov3_plus_qkvb",
                    "timm_rope_axial", "timm_rope_mixed", "timm_rope_mixed_ape", "timm_rope_reg1_gap", "hf_dinov3",
                    "hf_dinov3_gated")},
}
# The dtype each family fixture was written in (tests/fixtures/{families,rope}/cases.json).
FAMILY_DTYPES = {case: facts.get("dtype") for folder in ("families", "rope") for case, facts in json.loads(
    (FIXTURES / folder / "cases.json").read_text())["cases"].items()}
LATER_FAMILIES = ("families/", "rope/")
BACKENDS = ("tensorflow", "jax", "torch")
# A tiny ViT for training and the `.keras` round trip; dropout and stochastic depth on, so a file must keep them
# and inference must leave them out.
TINY = dict(patch_size=4, hidden_size=16, mlp_dim=32, num_heads=2, num_layers=2, image_size=8, classes=2,
            classifier_activation=None, dropout_rate=0.1, drop_path_rate=0.1)
# The `.keras` round trip's encoders: `EncoderBlock`s, `ScannedEncoder`'s stacked weights, and rotary positions
# learned per block on a run-time grid (the coordinates and angles computed in each backend's graph).
ENCODERS = {"unrolled": {}, "scan": {"scan_layers": True},
            "rope": {"scan_layers": True, "rotary_embedding": "rope_mixed", "dynamic_image_size": True}}


def numpy(x):
    return keras.ops.convert_to_numpy(x)


def official_logits():
    """{case: logits} of every official-format fixture, through `ViT.from_checkpoint`."""
    out = {}
    for case, overrides in OFFICIAL_CASES.items():
        model = keras_vit.ViT.from_checkpoint(FIXTURES / f"{case}.npz", classifier_activation=None, **overrides)
        out[case] = numpy(model(np.load(FIXTURES / f"{case}_io.npz")["images"]))
    for case in SCANNED_CASES:  # the same files into one ScannedEncoder: its loop on each backend
        model = keras_vit.ViT.from_checkpoint(FIXTURES / f"{case}.npz", classifier_activation=None, scan_layers=True,
                                              **OFFICIAL_CASES[case])
        out[f"{case}, scanned"] = numpy(model(np.load(FIXTURES / f"{case}_io.npz")["images"]))
    return out


def timm_logits():
    """{case: output} of every timm fixture, its images preprocessed as the file's config says."""
    out = {}
    for case, path in TIMM_CASES.items():
        model = keras_vit.ViT.from_checkpoint(FIXTURES / "timm" / path, classifier_activation=None)
        images = np.load(FIXTURES / "timm" / f"{case}_io.npz")["images"]
        out[case] = numpy(model(keras_vit.preprocess_input(images, config=model.vit_config)))
    return out


def extra_logits():
    """{case: output} of every EXTRA_CASES fixture (transformers, big_vision, registers, MAP), and
    {"case@48": output} at 48 px of the later families' float32 files and files without a position table (timm
    rounds a 16-bit file's resized table)."""
    out = {}
    for case, (path, io_name, key) in EXTRA_CASES.items():
        model = keras_vit.ViT.from_checkpoint(FIXTURES / path, classifier_activation=None)
        io = np.load(FIXTURES / io_name)
        out[case] = numpy(model(io["inputs"]))
        exact_at_48 = FAMILY_DTYPES.get(path.split("/")[1]) == "float32" or "pos_embed_48" not in io
        if path.startswith(LATER_FAMILIES) and f"{key}_48" in io and exact_at_48:
            bigger = keras_vit.ViT.from_checkpoint(FIXTURES / path, image_size=48, classifier_activation=None)
            out[f"{case}@48"] = numpy(bigger(io["inputs_48"]))
    return out


def learnable_data(count=64):
    """Noisy 8x8 images whose class is which half, left or right, is brighter."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, count)
    images = rng.normal(0.0, 0.3, (count, 8, 8, 3)).astype("float32")
    images[labels == 0, :, :4] += 1.0
    images[labels == 1, :, 4:] += 1.0
    return images, labels


def training_losses(epochs=4):
    """The loss of each epoch of `fit` on `learnable_data`, from fixed seeds."""
    keras.utils.set_random_seed(0)
    model = keras_vit.ViT(**TINY)
    model.compile(optimizer=keras.optimizers.Adam(1e-2),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    images, labels = learnable_data()
    history = model.fit(images, labels, batch_size=16, epochs=epochs, shuffle=False, verbose=0)
    return np.asarray(history.history["loss"], np.float32)


def analysis(model, images):
    """The analysis API's results on a model: attention maps, rollout, intermediates, distances, similarity."""
    maps = keras_vit.attention_maps(model, images)
    grids = keras_vit.intermediates(model, indices=[0, -1], norm=True, output="grid")(images)
    tokens = keras_vit.intermediates(model, indices=[-1])(images)["encoder_block_1"]
    return {
        **{f"attention_{i}": m for i, m in enumerate(maps)},
        "rollout": keras_vit.attention_rollout(maps, head_fusion="max", discard_ratio=0.5),
        "rollout_map": keras_vit.rollout_map(model, images),
        **{f"grid_{name}": numpy(grid) for name, grid in grids.items()},
        "prefix_tokens": numpy(tokens["prefix_tokens"]),
        "distance": keras_vit.mean_attention_distance(maps, grid_size=(4, 4), patch_size=8, num_prefix_tokens=1),
        "similarity": np.asarray(keras_vit.position_embedding_similarity(model)),
    }


def npz_round_trip(directory):
    """Whether `save_npz` then `load_npz` gives every weight back bit for bit, and the file's config the model's."""
    model = keras_vit.ViT.from_checkpoint(FIXTURES / "hybrid.npz", classifier_activation=None)
    path = keras_vit.save_npz(model, pathlib.Path(directory) / f"{keras.backend.backend()}_hybrid.npz")
    again = keras_vit.load_npz(keras_vit.ViT(model.vit_config, classifier_activation=None), path)
    same_weights = all(np.array_equal(numpy(a), numpy(b)) for a, b in zip(model.weights, again.weights, strict=True))
    return same_weights and keras_vit.config_from_checkpoint(path) == model.vit_config


def keras_file_images():
    return np.random.default_rng(1).uniform(-1, 1, (2, 8, 8, 3)).astype("float32")


def save_keras_files(directory):
    """Saves random tiny ViTs as `<backend>_<encoder>.keras`; {`saved_<encoder>`: their inference outputs}."""
    out = {}
    for encoder, fields in ENCODERS.items():
        model = keras_vit.ViT(**TINY, **fields)
        rng = np.random.default_rng(2)
        for weight in model.trainable_weights:  # the head starts at zero: every weight random, so all must arrive
            weight.assign(rng.normal(0.0, 0.3, weight.shape).astype("float32"))
        path = pathlib.Path(directory) / f"{keras.backend.backend()}_{encoder}.keras"
        partial = path.with_name(f"partial_{path.name}")  # the other backends, loading at once, see it whole or not
        model.save(partial)
        os.replace(partial, path)
        out[f"saved_{encoder}"] = numpy(model(keras_file_images()))
    return out


def wait_for_keras_files(directory, timeout=600):
    """Returns once every backend's `.keras` files are in `directory`, or a backend has failed (its tests say why;
    the others load what is there); raises at `timeout`."""
    directory = pathlib.Path(directory)
    expected = [directory / f"{saver}_{encoder}.keras" for saver in BACKENDS for encoder in ENCODERS]
    deadline = time.monotonic() + timeout
    while not all(path.exists() for path in expected) and not list(directory.glob("*.failed")):
        if time.monotonic() > deadline:
            raise TimeoutError(f"after {timeout} s, still no {[p.name for p in expected if not p.exists()]}")
        time.sleep(0.1)


def load_keras_files(directory):
    """{`loaded_<saver>_<encoder>`: outputs} of every other backend's `.keras` files in `directory`, loaded here."""
    out = {}
    for saver in BACKENDS:
        for encoder, fields in ENCODERS.items():
            path = pathlib.Path(directory) / f"{saver}_{encoder}.keras"
            if saver != keras.backend.backend() and path.exists():
                model = keras.saving.load_model(path)
                assert model.vit_config == keras_vit.ViT(**TINY, **fields).vit_config, path
                out[f"loaded_{saver}_{encoder}"] = numpy(model(keras_file_images()))
    return out


# `resize_pixels` cases: (image shape, size, crop_fraction, interpolation), on random uint8 images.
RESIZE_CASES = [((37, 53, 3), (24, 24), 1.0, "bilinear"), ((300, 200, 3), (32, 48), 0.875, "bilinear"),
                ((17, 120, 1), (24, 24), 0.875, "bicubic"), ((64, 64, 3), (224, 224), 0.875, "bicubic")]
EXPLAIN_FIGURES = ("rollout.png", "attention_distance.png", "position_similarity.png", "embedding_filters.png")


def resized(case):
    """{`resize:<case>`: resize_pixels, `resize_float:<case>`: resize_and_center_crop} of RESIZE_CASES[case]."""
    shape, size, crop_fraction, interpolation = RESIZE_CASES[case]
    image = np.random.default_rng(case).integers(0, 256, shape, dtype=np.uint8)
    return {f"resize:{case}": numpy(keras_vit.preprocessing.resize_pixels(image, size, crop_fraction, interpolation)),
            f"resize_float:{case}": numpy(keras_vit.resize_and_center_crop(image, size, crop_fraction,
                                                                           interpolation))}


def explain_image(directory):
    """An RGBA PNG (alpha to drop), written by Pillow, the same bytes on every backend."""
    from PIL import Image

    path = pathlib.Path(directory) / "explain.png"
    if not path.exists():  # the backends run at once: each writes its own copy, then renames it into place
        pixels = np.random.default_rng(3).integers(0, 256, (40, 30, 4), dtype=np.uint8)
        partial = path.with_name(f"partial_{keras.backend.backend()}_{path.name}")
        Image.fromarray(pixels, "RGBA").save(partial)
        os.replace(partial, path)
    return path


def explain(directory):
    """`explain:pixels`, the `.keras` tiny ViT's input read by `keras_vit.explain` (decoded, 0.875 crop); off
    TensorFlow also `explain:figures`, the figures its command (its flags, then `main`) writes."""
    from absl import flags

    from keras_vit import explain as command

    backend = keras.backend.backend()
    model, image = pathlib.Path(directory) / f"{backend}_unrolled.keras", explain_image(directory)
    pixels, _ = command.read_image(image, keras.saving.load_model(model).vit_config, 0.875)
    out = {"explain:pixels": pixels}
    if backend != "tensorflow":  # on TensorFlow tests/test_explain.py runs the command
        output = pathlib.Path(directory) / f"explain_{backend}"
        flags.FLAGS(["explain", f"--model={model}", f"--image={image}", f"--output={output}", "--crop_fraction=0.875"])
        assert command.main(["explain"]) == 0
        out["explain:figures"] = np.array(sorted(path.name for path in output.iterdir()
                                                 if path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")))
    return out


# Inputs of the wrong shape for a grey 8x8 ViT (issue 49), each refused by `predict`, a call and
# `predict_on_batch` with one ValueError naming both shapes; the 8x8 model once answered a 28x28 image.
WRONG_SHAPES = {"no channel axis": (2, 8, 8), "three channels": (2, 8, 8, 3), "28x28": (2, 28, 28, 1),
                "rank 5": (2, 1, 8, 8, 1)}
WAYS = {"predict": lambda model, x: model.predict(x, verbose=0), "call": lambda model, x: model(x),
        "predict_on_batch": lambda model, x: model.predict_on_batch(x)}


def grey_model():
    return keras_vit.ViT(patch_size=2, hidden_size=16, mlp_dim=32, num_heads=2, num_layers=1, classes=3,
                         input_shape=(8, 8, 1))


def wrong_inputs():
    """{`wrong:<case>:<way>`: the message of the ValueError, or the other outcome}, after right inputs of two batch
    sizes have run each way (traces a compiled function could generalise)."""
    model, rng = grey_model(), np.random.default_rng(4)
    for way in WAYS.values():
        for count in (2, 3):
            way(model, rng.uniform(-1, 1, (count, 8, 8, 1)).astype("float32"))
    out = {}
    for case, shape in WRONG_SHAPES.items():
        for name, way in WAYS.items():
            try:
                way(model, rng.uniform(-1, 1, shape).astype("float32"))
                outcome = "answered"
            except ValueError as error:
                outcome = str(error)
            except Exception as error:  # the wrong kind of error: the test shows it
                outcome = f"{type(error).__name__}: {error}"
            out[f"wrong:{case}:{name}"] = np.array(outcome)
    return out


def patch_dropout():
    """{`patch_dropout:<what>`}: PatchDropout's training draw (tokens, places) and inference answer on 2 examples of a
    class token and 10 numbered patches, and a tiny rotary ViT's encoded sequence in training and at inference."""
    from keras_vit.layers import PatchDropout

    tokens = np.arange(2 * 11 * 4, dtype="float32").reshape(2, 11, 4)
    layer = PatchDropout(0.5, num_prefix_tokens=1, return_indices=True, seed=0)
    kept, places = layer(tokens, training=True)
    same, every = layer(tokens)
    model = keras_vit.ViT(**TINY, rotary_embedding="rope_axial", position_embedding="none", patch_dropout=0.5)
    encoded = keras.Model(model.input, model.get_layer("encoder_block_1").output)
    return {"patch_dropout:tokens": tokens, "patch_dropout:kept": numpy(kept), "patch_dropout:places": numpy(places),
            "patch_dropout:inference": numpy(same), "patch_dropout:inference_places": numpy(every),
            "patch_dropout:encoded_training": numpy(encoded(keras_file_images(), training=True)),
            "patch_dropout:encoded": numpy(encoded(keras_file_images()))}


def tensorflow_imported():
    return any(name.split(".")[0] == "tensorflow" and module is not None for name, module in sys.modules.items())


def run(directory):
    """Every check on this process's backend but the loads of the other backends' `.keras` files; the results as a
    dict of arrays (keys prefixed by kind)."""
    out = {f"official:{case}": logits for case, logits in official_logits().items()}
    out.update({f"timm:{case}": logits for case, logits in timm_logits().items()})
    out.update({f"extra:{case}": logits for case, logits in extra_logits().items()})
    out["losses"] = training_losses()
    token = keras_vit.ViT.from_checkpoint(FIXTURES / "token.npz", classifier_activation=None)
    out.update({f"analysis:{k}": v for k, v in analysis(token, np.load(FIXTURES / "token_io.npz")["images"]).items()})
    token_images = np.load(FIXTURES / "token_io.npz")["images"]
    out["trim:whole"], out["trim:trimmed"] = (numpy(m(token_images)) for m in (token, keras_vit.trim_last_block(token)))
    out["npz_round_trip"] = npz_round_trip(directory)
    out.update(save_keras_files(directory))
    for case in range(len(RESIZE_CASES)):
        out.update(resized(case))
    out.update(explain(directory))
    out.update(wrong_inputs())
    out.update(patch_dropout())
    if keras.backend.backend() != "tensorflow":  # tests/test_fine_tuning.py runs them on TensorFlow
        out.update(fine_tuning_checks.run())
    out["backend"] = keras.backend.backend()
    out["tensorflow_imported"] = tensorflow_imported()
    return out


def main(directory):
    backend = keras.backend.backend()
    try:
        out = run(directory)
        wait_for_keras_files(directory)
        out.update(load_keras_files(directory))
    except BaseException:
        (pathlib.Path(directory) / f"{backend}.failed").touch()  # the other backends stop waiting for its files
        raise
    np.savez(pathlib.Path(directory) / f"{backend}.npz", **{**out, "tensorflow_imported": tensorflow_imported()})
    print(json.dumps({"backend": backend, "wrote": f"{backend}.npz", "tensorflow_imported": tensorflow_imported()}))


if __name__ == "__main__":
    main(*sys.argv[1:])
