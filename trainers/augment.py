"""Model Garden's augmentations, mended: RandAugment with faster versions of its costliest ops (the
same images), and Mixup/CutMix whose CutMix labels weigh what each image keeps.

Model Garden's Rotate, ShearX/Y and TranslateX/Y add an alpha channel to the
uint8 image, run `ImageProjectiveTransformV3` (nearest, reflect fill) over
each of the four channels of every pixel, then paint pixels whose alpha came
out 0 with the replace colour and drop the alpha. Nearest interpolation only
copies pixels, so here each pixel's channels are packed into one int32 and
moved at once, with the replace colour as the fill value, and a translation
by whole pixels is one gather: bit for bit the same image
(tests/trainers/test_augment.py) for a fraction of the work. These five ops,
then Solarize and SolarizeAdd (lookup tables below), were the costliest of
RandAugment's on the CPU, and RandAugment the input pipeline's largest cost
(docs/performance.md).

The policy itself (which op, magnitudes, probabilities, random draws) stays
Model Garden's: `RandAugment` only hands it these functions while it builds
its graph.
"""

import contextlib
import math

import tensorflow as tf
from official.vision.ops import augment


def _move_pixels(image, transform, replace):
    """`image` (uint8 [h, w, c], c <= 4) under the projective `transform` (8 floats): nearest, reflect fill."""
    channels = tf.shape(image)[-1]  # a decoded image's is known only when it runs
    padded = tf.ensure_shape(tf.pad(image, [[0, 0], [0, 0], [0, 4 - channels]]), [None, None, 4])
    packed = tf.bitcast(padded, tf.int32)  # [h, w]
    # Reflect fill reads inside the image (TF clamps the reflected coordinate); were a pixel left
    # unfilled, Model Garden's unwrap would paint it `replace`: that colour as one int32, little-endian.
    fill = sum(int(value) << (8 * k) for k, value in enumerate(list(replace)[:3]))
    moved = tf.raw_ops.ImageProjectiveTransformV3(
        images=packed[None, :, :, None], transforms=tf.reshape(transform, [1, 8]),
        output_shape=tf.shape(packed), fill_value=float(fill), interpolation="NEAREST", fill_mode="REFLECT")
    moved = tf.bitcast(moved[0, :, :, 0], tf.uint8)[:, :, :channels]
    return tf.ensure_shape(moved, image.shape)


def _matrix(*entries):
    return tf.stack([tf.cast(entry, tf.float32) for entry in entries])


def _shift_whole_pixels(image, pixels, axis):
    """Pixel i along `axis` takes pixel i + pixels, mirrored at the edges like TF's reflect fill (d c b a | a b c d)."""
    size = tf.shape(image)[axis]
    source = tf.math.floormod(tf.range(size) + tf.cast(pixels, tf.int32), 2 * size)
    return tf.gather(image, tf.where(source < size, source, 2 * size - 1 - source), axis=axis)


def _translate(image, pixels, replace, axis, transform):
    # Whole pixels (the usual: Model Garden's shift is magnitude x 10) need no interpolation: one gather.
    pixels = tf.cast(pixels, tf.float32)
    return tf.cond(tf.equal(pixels, tf.round(pixels)), lambda: _shift_whole_pixels(image, pixels, axis),
                   lambda: _move_pixels(image, transform, replace))


# The same signatures as Model Garden's (it inspects the argument names) and
# the same transforms (augment._convert_*_to_transform, written out).

def translate_x(image, pixels, replace):
    return _translate(image, pixels, replace, 1, _matrix(1, 0, pixels, 0, 1, 0, 0, 0))


def translate_y(image, pixels, replace):
    return _translate(image, pixels, replace, 0, _matrix(1, 0, 0, 0, 1, pixels, 0, 0))


def shear_x(image, level, replace):
    return _move_pixels(image, _matrix(1, level, 0, 0, 1, 0, 0, 0), replace)


def shear_y(image, level, replace):
    return _move_pixels(image, _matrix(1, 0, 0, level, 1, 0, 0, 0), replace)


def rotate(image, degrees, replace):
    """Clockwise by `degrees` about the image centre."""
    angle = tf.cast(degrees * (math.pi / 180.0), tf.float32)
    height, width = (tf.cast(size, tf.float32) for size in tf.unstack(tf.shape(image)[:2]))
    cos, sin = tf.math.cos(angle), tf.math.sin(angle)
    x_offset = ((width - 1) - (cos * (width - 1) - sin * (height - 1))) / 2.0
    y_offset = ((height - 1) - (sin * (width - 1) + cos * (height - 1))) / 2.0
    return _move_pixels(image, _matrix(cos, -sin, x_offset, sin, cos, y_offset, 0, 0), replace)


def _through_table(op, image, *args):
    """`image` mapped by `op`, an elementwise op on bytes, through its table: `op` run on the 256 byte values."""
    table = op(tf.cast(tf.range(256), tf.uint8), *args)
    return tf.gather(table, tf.cast(image, tf.int32))


# Solarize and SolarizeAdd map each byte on its own, so Model Garden's op run on
# the 256 possible values is their lookup table (about half their time).

def solarize(image, threshold=128):
    return _through_table(augment.solarize, image, threshold)


def solarize_add(image, addition=0, threshold=128):
    return _through_table(augment.solarize_add, image, addition, threshold)


FAST_OPS = {"Rotate": rotate, "ShearX": shear_x, "ShearY": shear_y, "TranslateX": translate_x,
            "TranslateY": translate_y, "Solarize": solarize, "SolarizeAdd": solarize_add}


@contextlib.contextmanager
def _fast_ops():
    """Model Garden's op table with `FAST_OPS` in it, for the duration of a graph build."""
    table = augment.NAME_TO_FUNC
    saved = {name: table[name] for name in FAST_OPS}
    table.update(FAST_OPS)
    try:
        yield
    finally:
        table.update(saved)


class RandAugment(augment.RandAugment):
    """`official.vision.ops.augment.RandAugment` with `FAST_OPS`: the same arguments and images."""

    def distort(self, image):
        with _fast_ops():
            return super().distort(image)


class MixupAndCutmix(augment.MixupAndCutmix):
    """`official.vision.ops.augment.MixupAndCutmix` whose CutMix label weights are the pixels' shares.

    Model Garden's CutMix weighs the labels by the box it drew, but pastes
    another: the box is clipped at the image's edges after the weight is
    taken, its width is drawn from the image's height, and its sides are cut
    to even lengths; an image's label weight was 0.18 off its share of the
    pixels on average (tests/trainers/test_augment.py). Here the weight is
    computed from the pasted box, as timm corrects it.
    """

    def _cutmix(self, images, labels):
        batch, height, width = tf.shape(images)[0], tf.shape(images)[1], tf.shape(images)[2]
        lam = self._sample_from_beta(self.cutmix_alpha, self.cutmix_alpha, tf.shape(labels))
        side = tf.math.sqrt(1.0 - lam)  # the box's side, as a fraction of the image's

        def span(size):  # [start, stop) of a box of side * size around a uniform centre, clipped to [0, size)
            length = tf.cast(side * tf.cast(size, tf.float32), tf.int32)
            centre = tf.random.uniform([batch], 0, size, dtype=tf.int32)
            start, stop = tf.maximum(centre - length // 2, 0), tf.minimum(centre + length - length // 2, size)
            inside = tf.range(size)[None, :]
            return tf.logical_and(inside >= start[:, None], inside < stop[:, None])  # [batch, size]

        box = tf.logical_and(span(height)[:, :, None], span(width)[:, None, :])  # [batch, height, width]
        images = tf.where(box[..., None], tf.reverse(images, [0]), images)
        kept = 1.0 - tf.reduce_mean(tf.cast(box, tf.float32), axis=[1, 2])
        return images, labels, kept

