"""keras_vit.image_formats: each header check in graph ops and on Python bytes, giving one answer."""

import io

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from keras_vit import image_formats

PIXELS = np.random.default_rng(0).integers(0, 256, (12, 10, 3), dtype=np.uint8)


def encoded(kind, **options):
    buffer = io.BytesIO()
    Image.fromarray(PIXELS).save(buffer, format=kind, **options)
    return buffer.getvalue()


def animated_webp():
    frames = [Image.fromarray(PIXELS), Image.fromarray(255 - PIXELS)]
    buffer = io.BytesIO()
    frames[0].save(buffer, format="WEBP", save_all=True, append_images=frames[1:], duration=100)
    return buffer.getvalue()


CASES = {  # name: (data, format index or None, animated)
    "JPEG": (encoded("JPEG"), image_formats.JPEG, False),
    "PNG": (encoded("PNG"), image_formats.PNG, False),
    "GIF": (encoded("GIF"), image_formats.GIF, False),
    "BMP": (encoded("BMP"), image_formats.BMP, False),
    "lossy WebP": (encoded("WEBP"), image_formats.WEBP, False),
    "lossless WebP": (encoded("WEBP", lossless=True), image_formats.WEBP, False),
    "animated WebP": (animated_webp(), image_formats.WEBP, True),
    "RIFF sound": (b"RIFF\0\0\0\0WAVEfmt " + bytes(20), None, False),
    "HTML": (b"<!doctype html><html>", None, False),
    "empty": (b"", None, False),
}


@pytest.mark.parametrize("name", CASES)
def test_graph_and_bytes_checks_agree(name):
    data, kind, animated = CASES[name]
    header = image_formats.header(tf.constant(data))
    graph_kind = int(image_formats.image_format(header))
    assert graph_kind == (-1 if kind is None else kind)
    assert image_formats.format_of_bytes(data[:image_formats.HEADER_BYTES]) == kind
    assert bool(image_formats.is_animated_webp(header, graph_kind)) == animated
    problem = image_formats.header_problem(data[:image_formats.HEADER_BYTES])
    if kind is None:
        assert problem.startswith("not a JPEG, PNG, GIF, BMP or WebP image")
    else:
        assert (problem == "an animated WebP (TensorFlow's decoder reads none as one image)") if animated else (
            problem is None)


@pytest.mark.parametrize("name", [name for name, (_, kind, _) in CASES.items() if kind is not None])
def test_declared_pixels_are_width_times_height_before_any_decoding(name):
    data, kind, _ = CASES[name]
    header = image_formats.header(tf.constant(data))
    declared = image_formats.declared_pixels(tf.constant(data), header, tf.constant(kind))
    assert int(declared) == 12 * 10  # an animated WebP: its canvas
