import collections
import json
import os
import re
import warnings

import keras
import numpy as np
import pytest

import keras_vit
from export import common, tflite
from keras_vit.model import outputs_probabilities

SIZE = 16
CLASSES = 3
TINY = dict(patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2, image_size=SIZE)


def colour_task(num_images, rng):
    """Images whose class is their brightest colour channel, by a margin of 0.05 to 0.5.

    Learnable in a hundred steps, and the small margins leave near-ties, so
    top-1 agreement after quantization says something.
    """
    images = rng.uniform(-1, 1, (num_images, SIZE, SIZE, 3)).astype("float32")
    labels = rng.integers(0, CLASSES, num_images)
    images[np.arange(num_images), :, :, labels] += rng.uniform(0.05, 0.5, (num_images, 1, 1)).astype("float32")
    return np.clip(images, -1, 1), labels


@pytest.fixture(scope="module")
def trained():
    """A 2-layer, 32-wide ViT trained for 128 steps; returns (model, 512 held-out images, calibration images)."""
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    images, labels = colour_task(256, rng)
    held_out, held_out_labels = colour_task(512, rng)
    model = keras_vit.ViT(**TINY, classes=CLASSES, classifier_activation=None)
    model.compile(keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(images, labels, batch_size=16, epochs=8, verbose=0)
    accuracy = np.mean(model.predict(held_out, verbose=0).argmax(-1) == held_out_labels)
    assert accuracy >= 0.85  # trained, so agreement is measured on a model that decides something
    return model, held_out, images


@pytest.fixture(scope="module")
def variants(trained):
    model, _, calibration = trained
    return {q: tflite.convert(model, q, representative_images=calibration) for q in tflite.QUANTIZATIONS}


@pytest.mark.parametrize("quantize", tflite.QUANTIZATIONS)
def test_every_quantization_runs_and_agrees_within_its_tolerance(trained, variants, quantize):
    model, held_out, _ = trained
    outputs = tflite.run(variants[quantize], held_out)
    assert outputs.shape == (512, CLASSES) and outputs.dtype == np.float32
    result = tflite.verify(variants[quantize], model, held_out)
    assert tflite.check_tolerance(quantize, result) == []
    assert tflite.non_builtin_ops(variants[quantize]) == []  # runs on a phone's default LiteRT, no Flex
    assert result["num_images"] == 512 and result["size_bytes"] == len(variants[quantize])
    assert result["latency_ms"] > 0


def test_float32_variant_reproduces_the_keras_logits(trained, variants):
    model, held_out, _ = trained
    np.testing.assert_allclose(tflite.run(variants["none"], held_out), model.predict(held_out, verbose=0), atol=1e-5)


def test_a_scanned_model_converts_with_its_loop(trained, tmp_path):
    model, held_out, _ = trained
    scanned = keras_vit.ViT(**TINY, classes=CLASSES, classifier_activation=None, scan_layers=True)
    keras_vit.load_npz(scanned, keras_vit.save_npz(model, tmp_path / "m.npz"))
    converted = tflite.convert(scanned)
    ops = tflite.float_ops(converted)
    assert "WHILE" in ops  # one block in a loop, not unrolled by the converter
    assert "GELU" in ops  # the loop's body is a subgraph of its own, which the interpreter does not list
    assert not {"NEG", "SQUARED_DIFFERENCE"} & set(ops)  # the block's LayerNorms, traced as LiteRT runs them fast
    np.testing.assert_allclose(tflite.run(converted, held_out), model.predict(held_out, verbose=0), atol=1e-5)
    # Its first LayerNorm is in the loop, so full int8 keeps the sequence's assembly in int8 too:
    # only the final LayerNorm and the pooling, after the loop, stay float.
    with pytest.warns(tflite.FewImagesWarning, match="16 image"):  # a few suffice for which ops stay float
        int8 = tflite.convert(scanned, "int8", representative_images=held_out[:16])
    assert tflite.float_ops(int8) == {"WHILE": 1, **FINAL_NORM_AND_POOLING}


def test_ops_outside_the_builtins_are_named():
    import tensorflow as tf

    flex = tf.function(lambda x: tf.cast(tf.strings.length(tf.strings.as_string(x)), tf.float32),
                       input_signature=[tf.TensorSpec([1, 4], tf.float32)])
    converter = tf.lite.TFLiteConverter.from_concrete_functions([flex.get_concrete_function()])
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS, tf.lite.OpsSet.SELECT_TF_OPS]
    assert tflite.non_builtin_ops(converter.convert()) == ["FlexAsString", "FlexStringLength"]


def test_quantized_variants_are_smaller(variants):
    sizes = {q: len(b) for q, b in variants.items()}
    # 32-wide weights are a small part of a tiny model, so the savings are well below 2x and 4x;
    # full int8 also carries its quantization parameters and the unfolded attention products'
    # ops (here 0.63 of float32, about float16's size).
    assert sizes["none"] > sizes["float16"] > sizes["dynamic"]
    assert sizes["int8"] < 0.7 * sizes["none"]


# The ops of the final LayerNorm (MEAN, SUB, MUL, MEAN, ADD epsilon, RSQRT, MUL, MUL gamma, ADD beta)
# and the class token's pooling.
FINAL_NORM_AND_POOLING = {"MEAN": 2, "SUB": 1, "MUL": 3, "ADD": 2, "RSQRT": 1, "STRIDED_SLICE": 1}


def test_int8_quantizes_gelu_softmax_and_layernorm(variants):
    # In float: only the sequence's assembly, the first LayerNorm and the final one with the pooling
    # (FLOAT_IN_INT8); every matmul (the head's too), GELU, softmax and the other LayerNorms are int8.
    first = {"CONCATENATION": 1, "RESHAPE": 1, "ADD": 2,  # prefix token, grid, positions; LayerNorm's epsilon
             "MEAN": 2, "SUB": 1, "RSQRT": 1, "MUL": 3}  # the first LayerNorm up to its beta
    assert tflite.float_ops(variants["int8"]) == dict(collections.Counter(first) + collections.Counter(
        FINAL_NORM_AND_POOLING))
    interpreter = tflite.make_interpreter(variants["int8"], delegates=False)
    tensors = interpreter.get_tensor_details()
    for op in interpreter._get_ops_details():
        for output in op["outputs"]:
            if tensors[output]["dtype"] == np.float32 and op["op_name"] != "DEQUANTIZE":
                assert tflite.FLOAT_IN_INT8.search(tensors[output]["name"]), tensors[output]["name"]
    float_model_ops = tflite.float_ops(variants["none"])
    assert {"FULLY_CONNECTED", "SOFTMAX", "GELU", "BATCH_MATMUL"} <= set(float_model_ops)


def test_layernorm_and_attention_are_traced_in_ops_litert_runs_fast(trained, variants):
    # LiteRT's int8 NEG, SQUARED_DIFFERENCE and BATCH_MATMUL are slow on x86, and
    # in float32 the same LayerNorm in SUB and MUL is fewer ops: every variant
    # traces LayerNorm with SUB and MUL, and full int8 also unfolds the attention
    # products into FULLY_CONNECTEDs.
    blocks = TINY["num_layers"]
    for quantize, variant in variants.items():
        ops = collections.Counter(
            op["op_name"] for op in tflite.make_interpreter(variant, delegates=False)._get_ops_details())
        assert not {"NEG", "SQUARED_DIFFERENCE"} & set(ops), quantize
        assert ops["SUB"] == 2 * blocks + 1, quantize  # one per LayerNorm
        assert ops["BATCH_MATMUL"] == (0 if quantize == "int8" else 2 * blocks), quantize
    model, _, _ = trained
    norms = [model.get_layer("encoder_norm")] + [getattr(model.get_layer(f"encoder_block_{i}"), norm)
                                                 for i in range(blocks) for norm in ("norm_1", "norm_2")]
    assert not any("call" in vars(norm) for norm in norms)  # the tracing swap is undone


def test_litert_layer_norm_is_keras_layer_norm():
    norm = keras.layers.LayerNormalization(epsilon=1e-6)
    x = np.random.default_rng(0).normal(3, 2, (2, 5, 8)).astype("float32")
    norm.build(x.shape)
    norm.gamma.assign(np.linspace(-2, 2, 8)), norm.beta.assign(np.linspace(1, -1, 8))
    np.testing.assert_allclose(tflite._layer_norm(norm, x), norm(x), atol=1e-5)


def test_int8_needs_the_class_token_kept_in_float(trained, variants, monkeypatch):
    # The class token (|x| <= 0.06 with its position) shares the int8 scale of
    # patch tokens about 50x larger; quantized with them, the logits move about
    # twice as far (here 99.2% top-1 agreement against 99.8%, 1.39 against 0.77
    # at most).
    model, held_out, calibration = trained
    assert np.abs(model.get_layer("class_token").weights[0].numpy()).max() < 0.05
    monkeypatch.setattr(tflite, "FLOAT_IN_INT8", re.compile("matches no tensor"))
    all_int8 = tflite.convert(model, "int8", representative_images=calibration)
    assert tflite.float_ops(all_int8) == {}
    expected = model.predict(held_out, verbose=0)
    kept_error, all_int8_error = (np.abs(tflite.run(converted, held_out) - expected).max()
                                  for converted in (variants["int8"], all_int8))
    assert 1.5 * kept_error < all_int8_error
    agreement = {name: tflite.verify(converted, model, held_out)["top1_agreement"]
                 for name, converted in (("kept", variants["int8"]), ("all_int8", all_int8))}
    assert agreement["all_int8"] < agreement["kept"]


def test_int8_keeps_the_final_layernorm_in_float(trained, variants):
    # The features the head reads share one int8 scale that spans the final LayerNorm's largest gammas:
    # kept in float with the pooling, the logits' mean error falls (here 0.022 against 0.039; by a third on
    # the main job's digits model, to a quarter on a B/16: benchmarks/int8_agreement.py). One calibration.
    model, held_out, calibration = trained
    calibrated = tflite.calibrate(model, calibration)
    start_only = re.compile(f"{tflite._ASSEMBLY.pattern}|{tflite._FIRST_NORM.pattern}")
    expected = model.predict(held_out, verbose=0)
    default, start = (np.abs(tflite.run(tflite.quantize_calibrated(calibrated, pattern), held_out) - expected).mean()
                      for pattern in (None, start_only))
    assert 1.4 * default < start
    # The default is what `convert` makes, and it keeps the head's matmul int8.
    np.testing.assert_array_equal(tflite.run(variants["int8"], held_out[:16]),
                                  tflite.run(tflite.quantize_calibrated(calibrated), held_out[:16]))
    assert "FULLY_CONNECTED" not in tflite.float_ops(variants["int8"])


def test_verify_applies_softmax_once(trained, variants):
    model, held_out, _ = trained
    probabilities = keras.Model(model.input, keras.layers.Activation("softmax")(model.output))
    assert outputs_probabilities(probabilities) and not outputs_probabilities(model)
    assert outputs_probabilities(keras.Model(model.input, keras.layers.Softmax()(model.output)))
    on_probabilities = tflite.verify(tflite.convert(probabilities), probabilities, held_out)
    on_logits = tflite.verify(variants["none"], model, held_out)
    assert on_probabilities["top1_agreement"] == on_logits["top1_agreement"] == 1.0
    assert on_probabilities["max_abs_diff_probabilities"] < 1e-5


def test_bad_arguments_are_refused(trained, tmp_path):
    model, held_out, _ = trained
    with pytest.raises(ValueError, match="representative_images=None"):
        tflite.convert(model, "int8")
    with pytest.raises(ValueError, match=r"received shape \(512, 8, 8, 3\)"):
        tflite.convert(model, "int8", representative_images=held_out[:, :8, :8])
    with pytest.raises(ValueError, match="received quantize='int4'"):
        tflite.convert(model, "int4")
    with pytest.raises(ValueError, match="verify_images=None"):
        tflite.export_tflite(model, tmp_path / "out")
    with pytest.raises(ValueError, match="received 2 labels"):
        tflite.export_tflite(model, tmp_path / "out", verify_images=held_out, labels=["a", "b"])
    headless = keras_vit.ViT(**TINY, include_top=False)  # its check would compare softmaxed features
    with pytest.raises(ValueError, match="no classification head .* Export the features as a SavedModel"):
        tflite.export_tflite(headless, tmp_path / "out", verify_images=held_out)
    dynamic = keras_vit.ViT(**TINY, classes=CLASSES, dynamic_image_size=True)
    with pytest.raises(ValueError, match=r"received input_shape=\(None, None, None, 3\)"):
        tflite.convert(dynamic)
    # Outputs neither probabilities nor logits: softmaxed as logits, they would be checked and labelled wrongly.
    sigmoid = keras_vit.ViT(**TINY, classes=CLASSES, classifier_activation="sigmoid")
    with pytest.raises(ValueError, match="softmax or return logits.*received the activation 'sigmoid' of layer 'head'"):
        tflite.export_tflite(sigmoid, tmp_path / "out", verify_images=held_out)
    # Pixels not scaled: the check would run on inputs the model never sees, and int8 calibrate to them.
    with pytest.raises(ValueError, match=r"`verify_images` must be .* in \[-1, 1\].*received values in \[0, 255\]"):
        tflite.export_tflite(model, tmp_path / "out", verify_images=np.round((held_out + 1) * 127.5))
    with pytest.raises(ValueError, match=r"`representative_images` must be .* in \[-1, 1\]"):
        tflite.convert(model, "int8", representative_images=held_out * 2)
    assert os.listdir(tmp_path) == []


def test_export_writes_model_labels_and_metadata(trained, tmp_path):
    model, held_out, _ = trained
    output_dir = tmp_path / "exports" / "vit"
    result = tflite.export_tflite(model, output_dir, "dynamic", verify_images=held_out,
                                  labels=["red", "green", "blue"], metadata={"source": "colour_task"})
    assert sorted(os.listdir(output_dir)) == ["labels.txt", "metadata.json", "model_dynamic.tflite"]
    assert os.listdir(tmp_path / "exports") == ["vit"]  # no staging directory left beside it
    assert (output_dir / "labels.txt").read_text() == "red\ngreen\nblue\n"
    written = (output_dir / "model_dynamic.tflite").read_bytes()
    assert result["tflite_path"] == str(output_dir / "model_dynamic.tflite") and len(written) == result["size_bytes"]
    np.testing.assert_array_equal(
        tflite.run(written, held_out[:4]).argmax(-1), model.predict(held_out[:4], verbose=0).argmax(-1))
    metadata = json.loads((output_dir / "metadata.json").read_text())
    assert metadata["source"] == "colour_task" and metadata["quantize"] == "dynamic"
    assert metadata["input"] == {"shape": [1, SIZE, SIZE, 3], "dtype": "float32", "range": [-1.0, 1.0]}
    assert metadata["output"] == {"shape": [1, CLASSES], "dtype": "float32", "kind": "logits"}
    assert metadata["top1_agreement"] == result["top1_agreement"] >= tflite.TOLERANCES["dynamic"]["agreement"]
    assert metadata["forced"] is False and metadata["num_images"] == 512
    imagenet = keras_vit.ViT(**TINY, input_mean=(0.485, 0.456, 0.406), input_std=(0.229, 0.224, 0.225))
    low, high = common.input_and_output(imagenet)["input"]["range"]  # what its mean and std span, not [-1, 1]
    assert round(low, 3) == -2.118 and round(high, 3) == 2.64


def test_full_int8_on_one_image_warns_naming_the_counts(trained, tmp_path):
    """Calibrated and verified on one image, full int8 was written without a word."""
    model, held_out, calibration = trained
    with pytest.warns(tflite.FewImagesWarning) as warned:
        tflite.export_tflite(model, tmp_path / "one", "int8", representative_images=calibration[:1],
                             verify_images=held_out[:1], force=True)
    messages = [str(w.message) for w in warned if w.category is tflite.FewImagesWarning]
    assert [m.split(",")[0] for m in messages] == ["Full int8 calibrated on 1 image(s)",
                                                   "Full int8 verified on 1 image(s)"]
    assert all("fewer than 100" in m for m in messages)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tflite.FewImagesWarning)
        tflite._warn_if_few(tflite.MIN_INT8_IMAGES, "calibrated")  # enough: no warning


def test_failed_verification_is_refused_unless_forced(trained, tmp_path, monkeypatch):
    model, held_out, _ = trained
    monkeypatch.setitem(tflite.TOLERANCES, "none", dict(max_abs=-1.0, agreement=1.0))
    with pytest.raises(tflite.ToleranceError, match=r"max \|difference\| of probabilities .* > -1.*force=True"):
        tflite.export_tflite(model, tmp_path / "refused", verify_images=held_out)
    assert os.listdir(tmp_path) == []
    with pytest.warns(UserWarning, match="FAILED VERIFICATION"):
        result = tflite.export_tflite(model, tmp_path / "forced", verify_images=held_out, force=True)
    assert result["forced"] is True
    assert json.loads((tmp_path / "forced" / "metadata.json").read_text())["forced"] is True


def test_interrupted_export_leaves_nothing(trained, tmp_path, monkeypatch):
    model, held_out, _ = trained
    written_before_failure = []

    def failing_dump(obj, f, **kwargs):
        written_before_failure.extend(os.listdir(os.path.dirname(f.name)))
        raise OSError("disk full")

    monkeypatch.setattr(common.json, "dump", failing_dump)
    with pytest.raises(OSError, match="disk full"):
        tflite.export_tflite(model, tmp_path / "vit", verify_images=held_out, labels=["r", "g", "b"])
    assert "model_none.tflite" in written_before_failure
    assert os.listdir(tmp_path) == []


def test_existing_output_dir_is_refused(trained, tmp_path):
    model, held_out, _ = trained
    (tmp_path / "vit").mkdir()
    (tmp_path / "vit" / "keep").write_text("x")
    with pytest.raises(ValueError, match="must not exist"):
        tflite.export_tflite(model, tmp_path / "vit", verify_images=held_out)
    assert os.listdir(tmp_path / "vit") == ["keep"]


def test_print_table(capsys):
    rows = [dict(quantize="none", size_bytes=2048, top1_agreement=1.0, max_abs_diff_probabilities=1.5e-7,
                 latency_ms=0.25),
            dict(quantize="int8", size_bytes=1024, top1_agreement=0.96875, max_abs_diff_probabilities=0.031,
                 latency_ms=0.125)]
    tflite.print_table(rows)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["variant", "size", "KiB", "top-1", "agree", "max", "|dp|", "latency", "ms"]
    assert lines[2].split() == ["none", "2.0", "1.000", "1.50e-07", "0.250"]
    assert lines[3].split() == ["int8", "1.0", "0.969", "3.10e-02", "0.125"]
