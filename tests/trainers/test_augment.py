import numpy as np
import pytest
import tensorflow as tf
from official.vision.ops import augment as model_garden

from trainers import augment

REPLACE = [128, 128, 128]


def images(seed, count=4):
    """uint8 images of odd and even, square and oblong sizes, with structure (so a shifted pixel shows)."""
    rng = np.random.default_rng(seed)
    shapes = [(224, 224), (37, 53), (64, 31), (8, 8)][:count]
    return [tf.constant(rng.integers(0, 256, (*shape, 3), dtype=np.uint8)) for shape in shapes]


CASES = [  # whole and fractional shifts, beyond one and two widths: both of the translations' paths
    ("TranslateX", [0.0, 3.0, -7.5, 0.5, 100.0, -250.0, 150.0, -90.0, 600.0, -1.0]),
    ("TranslateY", [0.0, 2.0, -13.25, 0.5, 60.0, 250.0, -150.0, 90.0, -600.0, 1.0]),
    ("ShearX", [0.0, 0.1, -0.3, 0.25, 1.5]),
    ("ShearY", [0.0, -0.05, 0.3, -0.25, 2.0]),
    ("Rotate", [0.0, 30.0, -30.0, 90.0, 45.5, -180.0, 7.0]),
]


@pytest.mark.parametrize("name, levels", CASES, ids=[name for name, _ in CASES])
def test_each_geometric_op_gives_model_gardens_image_bit_for_bit(name, levels):
    ours, theirs = augment.FAST_OPS[name], model_garden.NAME_TO_FUNC[name]
    for image in images(0):
        for level in levels:
            expected = theirs(image, level, REPLACE).numpy()
            received = ours(image, tf.constant(level), REPLACE).numpy()
            assert received.dtype == np.uint8 and received.shape == image.shape
            np.testing.assert_array_equal(received, expected, err_msg=f"{name}({level}) on {image.shape}")
    # In the input pipeline a decoded image's shape is known only when it runs.
    unknown = tf.function(lambda image: ours(image, tf.constant(levels[-1]), REPLACE),
                          input_signature=[tf.TensorSpec([None, None, None], tf.uint8)])
    image = images(0, 1)[0]
    np.testing.assert_array_equal(unknown(image).numpy(), theirs(image, levels[-1], REPLACE).numpy())


@pytest.mark.parametrize("name, arguments", [
    ("Solarize", [(0,), (77,), (128,), (255,), (256,), (384,)]),
    ("SolarizeAdd", [(0, 128), (110, 128), (-128, 128), (165, 128), (50, 0), (50, 256)]),
])
def test_each_lookup_op_gives_model_gardens_image_bit_for_bit(name, arguments):
    ours, theirs = augment.FAST_OPS[name], model_garden.NAME_TO_FUNC[name]
    every = tf.constant(np.arange(256, dtype=np.uint8).reshape(16, 16, 1).repeat(3, -1))
    for image in [every, *images(3)]:
        for args in arguments:
            expected = theirs(image, *args).numpy()
            received = ours(image, *args).numpy()  # Python ints, as the policy passes them
            assert received.dtype == np.uint8 and received.shape == image.shape
            np.testing.assert_array_equal(received, expected, err_msg=f"{name}{args} on {image.shape}")


@pytest.mark.parametrize("channels", [1, 2, 3, 4])
def test_any_channel_count_is_packed_and_unpacked_exactly(channels):
    image = tf.constant(np.random.default_rng(channels).integers(0, 256, (9, 7, channels), dtype=np.uint8))
    identity = augment._move_pixels(image, tf.constant([1.0, 0, 0, 0, 1, 0, 0, 0]), REPLACE)
    np.testing.assert_array_equal(identity.numpy(), image.numpy())
    flipped = augment._move_pixels(image, tf.constant([-1.0, 0, 6, 0, 1, 0, 0, 0]), REPLACE)  # x -> 6 - x
    np.testing.assert_array_equal(flipped.numpy(), image.numpy()[:, ::-1])


def test_rand_augment_runs_model_gardens_policy_with_the_fast_ops():
    """The policy is Model Garden's code; only its five geometric ops are ours (each proven equal above).

    Image for image equality under one seed cannot be asked: TF seeds each stateful random op from the
    number of ops built before it, and the fast ops build fewer.
    """
    image = images(2, 1)[0]
    settings = dict(num_layers=2, magnitude=15, exclude_ops=["Cutout"])  # as the recipes: no magnitude_std

    def transforms(randaugment):
        """The element type of every projective transform in the graph, branch functions included."""
        graph = tf.function(randaugment.distort).get_concrete_function(image).graph.as_graph_def()
        nodes = [node for function in graph.library.function for node in function.node_def]
        return sorted(tf.dtypes.as_dtype(node.attr["dtype"].type).name
                      for node in nodes if node.op == "ImageProjectiveTransformV3")

    # Two layers, each a case over the ops: five geometric ones, moved as packed int32 pixels.
    assert transforms(augment.RandAugment(**settings)) == ["int32"] * 10
    assert transforms(model_garden.RandAugment(**settings)) == ["uint8"] * 10
    assert model_garden.NAME_TO_FUNC["Rotate"] is model_garden.wrapped_rotate  # the table is Model Garden's again
    assert model_garden.NAME_TO_FUNC["Solarize"] is model_garden.solarize
    tf.random.set_seed(0)
    augmented = tf.function(lambda x: tf.map_fn(augment.RandAugment(**settings).distort, x))(tf.stack([image] * 16))
    assert augmented.dtype == tf.uint8 and augmented.shape == (16, *image.shape)
    assert len({a.tobytes() for a in augmented.numpy()}) > 8  # each image drew its own ops


def test_cutmix_labels_weigh_the_pixels_each_image_keeps():
    # Each image is a constant, its own index: its share of the mixed image is countable.
    tf.random.set_seed(0)
    batch, classes = 16, 16
    mixer = augment.MixupAndCutmix(num_classes=classes, mixup_alpha=0.0, cutmix_alpha=1.0, label_smoothing=0.0)
    images = tf.broadcast_to(tf.reshape(tf.range(batch, dtype=tf.float32), [batch, 1, 1, 1]), [batch, 8, 12, 3])
    pasted = 0
    for _ in range(10):
        mixed, labels = (t.numpy() for t in mixer(images, tf.range(batch)))
        for i in range(batch):
            np.testing.assert_allclose(labels[i, i], np.mean(mixed[i, ..., 0] == i), atol=1e-6)
            partner = batch - 1 - i  # the batch reversed
            np.testing.assert_allclose(labels[i, partner], np.mean(mixed[i, ..., 0] == partner), atol=1e-6)
        pasted += np.sum(labels.max(-1) < 1)
    assert pasted > 50  # boxes were pasted, not only whole images kept
