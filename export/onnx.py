"""ONNX export: the model for ONNX Runtime (and TensorRT, OpenVINO, CoreML's converters), checked before it is written.

`python -m export --format=onnx --output=DIR` writes `DIR/model.onnx`,
`labels.txt` when labels are given, and `metadata.json`. The model takes the
contract of the OpenVINO IR: float32 `(batch, height, width, channels)`
scaled by `keras_vit.preprocess_input` (input `inputs`, any batch), and
returns float32 `scores` (probabilities or logits, as `metadata.json` says).
A class-token head is converted trimmed (`keras_vit.trim_last_block`).

The file comes from TensorFlow's graph of the model through tf2onnx (what
Keras' own `model.export(format="onnx")` calls on this backend, which names
the output `Identity:0`), at opset `OPSET` (BUILD.md says why). Before the
directory appears, a fresh Python process that imports only ONNX Runtime and
numpy (as a deployment does) loads the staged file on ONNX Runtime's CPU
provider with its default graph optimisations and scores the given real
images; they must match Keras at the float tolerance (1e-4 in
probabilities, every top-1 the same).

tf2onnx writes Keras' LayerNormalization as its arithmetic (GlobalAveragePool,
Sub, Mul, Sqrt, Reciprocal, ...), a form ONNX Runtime's LayerNormFusion does
not recognise, so every norm ran as about ten elementwise kernels. `convert`
rewrites the converted graph (`_fuse_for_runtimes`, standard ONNX ops only):
each such norm becomes one `LayerNormalization`, attention's per-head bias is
added before the head split with the query's power-of-two scale folded into
its kernel (exact), and the query, key and value products of one input become
one MatMul and a Split, as timm's export has them (three narrow GEMMs thread
worse than one wide one at small batch). BUILD.md records why.
"""

import collections
import contextlib
import os

import numpy as np
import tensorflow as tf

from export import common
from keras_vit.trim import trim_last_block

FILE = "model.onnx"  # beside common.LABELS_FILE and METADATA_FILE
# ONNX 1.12's opset (2022): LayerNormalization is an op; ONNX Runtime, TensorRT 8.6+ and OpenVINO read it.
OPSET = 17

# What a deployment runs: ONNX Runtime and numpy, no TensorFlow (checked in the process itself).
CLIENT = """
import sys
import numpy as np
import onnxruntime
session = onnxruntime.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
images = np.load(sys.argv[2])
scores = [session.run(["scores"], {"inputs": images[i:i + 32]})[0] for i in range(0, len(images), 32)]
assert not any(m.split(".")[0] in ("tensorflow", "keras", "keras_vit") for m in sys.modules), "not a bare client"
np.save(sys.argv[3], np.concatenate(scores))
"""


def convert(model, opset=OPSET):
    """`model` (trimmed where it can be) as a serialized ONNX model with input `inputs` and output `scores`."""
    import tf2onnx  # the export extra's; it imports TensorFlow, as this module does

    served = trim_last_block(model)
    signature = tf.TensorSpec((None, *common.input_shape(model)[1:]), tf.float32, name="inputs")
    forward = tf.function(lambda inputs: {"scores": served(inputs, training=False)}, input_signature=[signature],
                          autograph=False)
    with _uncopied_optimizer_passes():
        proto, _ = tf2onnx.convert.from_function(forward, input_signature=[signature], opset=opset)
    _fuse_for_runtimes(proto)
    return proto.SerializeToString()


@contextlib.contextmanager
def _uncopied_optimizer_passes():
    """tf2onnx without its copy of the graph, weights included, before each optimizer pass (kept to undo a pass that
    fails): the copies wait for Python's cycle collector, and ViT-B/16's conversion grew past 14 GB. A pass that fails
    now raises, which the export reports, instead of being skipped. Any value of the variable turns the copies off."""
    previous = os.environ.get("TF2ONNX_CATCH_ERRORS")
    os.environ["TF2ONNX_CATCH_ERRORS"] = "FALSE"
    try:
        yield
    finally:
        if previous is None:
            del os.environ["TF2ONNX_CATCH_ERRORS"]
        else:
            os.environ["TF2ONNX_CATCH_ERRORS"] = previous


def _fuse_for_runtimes(proto):
    """Rewrites `proto`'s graph in place into the forms runtimes fuse; returns how many rewrites each pass made."""
    from onnx import shape_inference

    shapes = shape_inference.infer_shapes(proto).graph
    ranks = {value.name: len(value.type.tensor_type.shape.dim) for value in
             [*shapes.value_info, *shapes.input, *shapes.output] if value.type.tensor_type.HasField("shape")}
    return {"layer_norms": _Graph(proto.graph).rewrite(_layer_norm, ranks),
            "head_biases": _Graph(proto.graph).rewrite(_head_bias),
            "sibling_matmuls": _Graph(proto.graph).rewrite_groups(_sibling_matmuls)}


class _Graph:
    """An ONNX graph's producers, consumers and constants, and its rewriting: matched nodes out, new nodes in."""

    def __init__(self, graph):
        self.graph, self.new_constants = graph, []
        self.constants = {tensor.name: tensor for tensor in graph.initializer}
        self.consumers = collections.defaultdict(list)
        for node in graph.node:
            for name in dict.fromkeys(node.input):  # once per node, even where it reads a tensor twice
                self.consumers[name].append(node)
        self.outputs = {value.name for value in graph.output}

    def constant(self, name):
        from onnx import numpy_helper

        return numpy_helper.to_array(self.constants[name]) if name in self.constants else None

    def add_constant(self, name, array):
        from onnx import numpy_helper

        self.new_constants.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def only(self, name, op_type):
        """The one node that reads `name`, when it is an `op_type` and `name` is not a graph output; else None."""
        readers = self.consumers.get(name, [])
        if len(readers) == 1 and readers[0].op_type == op_type and name not in self.outputs:
            return readers[0]
        return None

    def rewrite(self, match, *args):
        """`match(graph, node, *args)` gives (the matched nodes, the new nodes that replace them) or None; the new
        nodes take the place of the first matched node in the graph's order."""
        matches = []
        taken = set()
        for node in self.graph.node:
            found = None if id(node) in taken else match(self, node, *args)
            if found and not taken.intersection(map(id, found[0])):
                taken.update(map(id, found[0]))
                matches.append(found)
        self._apply(matches)
        return len(matches)

    def rewrite_groups(self, match):
        matches = match(self)
        self._apply(matches)
        return len(matches)

    def _apply(self, matches):
        first, drop = {}, set()
        position = {id(node): i for i, node in enumerate(self.graph.node)}
        for old, new in matches:
            first[id(min(old, key=lambda node: position[id(node)]))] = new
            drop.update(map(id, old))
        nodes = []
        for node in self.graph.node:
            nodes.extend(first.get(id(node), []))
            if id(node) not in drop:
                nodes.append(node)
        del self.graph.node[:]
        self.graph.node.extend(nodes)
        self.graph.initializer.extend(self.new_constants)
        read = {name for node in self.graph.node for name in node.input}
        for tensor in [tensor for tensor in self.graph.initializer if tensor.name not in read]:
            self.graph.initializer.remove(tensor)


def _other(node, name):
    """The input of binary `node` that is not `name`, or None where `name` is not one of its two inputs."""
    if len(node.input) != 2 or name not in node.input:
        return None
    return node.input[1] if node.input[0] == name else node.input[0]


def _layer_norm(g, mean, ranks):
    """tf2onnx's form of Keras' LayerNormalization over the last axis of a rank-3 tensor, from its mean on:
    `x * g + (beta - mean * g)` with `g = gamma / sqrt(mean((x - mean)^2) + eps)` (beta is left out where it is
    constant zero); as one LayerNormalization (opset 17)."""
    from onnx import helper

    if mean.op_type != "GlobalAveragePool" or ranks.get(mean.input[0]) != 3:  # rank 3: it averages the last axis
        return None
    x, m = mean.input[0], mean.output[0]
    readers = g.consumers.get(m, [])
    sub = [node for node in readers if node.op_type == "Sub" and list(node.input) == [x, m]]
    neg = [node for node in readers if node.op_type == "Neg"]
    if len(readers) != 2 or len(sub) != 1 or len(neg) != 1 or m in g.outputs:
        return None
    sub, neg = sub[0], neg[0]
    square = g.only(sub.output[0], "Mul")
    if square is None or list(square.input) != [sub.output[0]] * 2:
        return None
    variance = g.only(square.output[0], "GlobalAveragePool")
    add_eps = variance and g.only(variance.output[0], "Add")
    eps = g.constant(_other(add_eps, variance.output[0])) if add_eps else None
    sqrt = g.only(add_eps.output[0], "Sqrt") if eps is not None and eps.size == 1 else None
    reciprocal = sqrt and g.only(sqrt.output[0], "Reciprocal")
    scale = reciprocal and g.only(reciprocal.output[0], "Mul")
    gamma = g.constant(_other(scale, reciprocal.output[0])) if scale else None
    if gamma is None or gamma.ndim == 0 or gamma.size != gamma.shape[-1] or scale.output[0] in g.outputs:
        return None
    s = scale.output[0]
    readers = g.consumers.get(s, [])
    x_mul = [node for node in readers if node.op_type == "Mul" and _other(node, s) == x]
    mean_mul = [node for node in readers if node.op_type == "Mul" and _other(node, s) == neg.output[0]]
    if len(readers) != 2 or len(x_mul) != 1 or len(mean_mul) != 1 or g.only(neg.output[0], "Mul") is None:
        return None
    x_mul, mean_mul = x_mul[0], mean_mul[0]
    matched = [mean, sub, neg, square, variance, add_eps, sqrt, reciprocal, scale, x_mul, mean_mul]
    shift, beta = mean_mul.output[0], np.zeros(gamma.shape[-1], gamma.dtype)
    add_beta = g.only(shift, "Add")
    constant_beta = g.constant(_other(add_beta, shift)) if add_beta else None
    if constant_beta is not None:
        if constant_beta.ndim == 0 or constant_beta.size != constant_beta.shape[-1] or constant_beta.size != gamma.size:
            return None
        matched.append(add_beta)
        shift, beta = add_beta.output[0], constant_beta
    total = g.only(shift, "Add")
    if total is None or _other(total, shift) != x_mul.output[0] or g.only(x_mul.output[0], "Add") is not total:
        return None
    matched.append(total)
    name = total.output[0].split(":")[0] + "_layer_norm"
    norm = helper.make_node("LayerNormalization", [x, g.add_constant(name + "_scale", gamma.reshape(-1)),
                                                   g.add_constant(name + "_bias", beta.reshape(-1))],
                            [total.output[0]], name=name, axis=-1, epsilon=float(eps.reshape(-1)[0]))
    return matched, [norm]


def _head_bias(g, matmul):
    """`MatMul(x, kernel) -> Reshape(.., heads, head_dim) -> Add(bias[heads, head_dim])`, then maybe a
    `Mul(power of two)` (the query's 1/sqrt(head_dim)): the bias added before the Reshape, on the product as
    `_sibling_matmuls` takes it, and the scale folded into kernel and bias (exact for a power of two)."""
    from onnx import helper

    kernel = g.constant(matmul.input[1]) if matmul.op_type == "MatMul" else None
    reshape = g.only(matmul.output[0], "Reshape") if kernel is not None and kernel.ndim == 2 else None
    shape = g.constant(reshape.input[1]) if reshape else None
    add = g.only(reshape.output[0], "Add") if shape is not None and shape.size >= 2 else None
    bias = g.constant(_other(add, reshape.output[0])) if add else None
    if bias is None or bias.ndim < 2 or bias.shape[-2:] != tuple(shape[-2:]) or bias.size != kernel.shape[1]:
        return None
    matched, factor, last = [add], 1.0, add
    mul = g.only(add.output[0], "Mul")
    scale = g.constant(_other(mul, add.output[0])) if mul else None
    if scale is not None and scale.size == 1 and np.frexp(scale.reshape(-1)[0])[0] == 0.5:  # 2**k
        matched, factor, last = [add, mul], scale.reshape(-1)[0], mul
    name = matmul.output[0].split(":")[0]
    if factor != 1.0:
        kernel_name = g.add_constant(name + "_scaled_kernel", kernel * factor)
    else:
        kernel_name = matmul.input[1]
    new = [helper.make_node("MatMul", [matmul.input[0], kernel_name], [name + "_product"], name=name + "_matmul"),
           helper.make_node("Add", [name + "_product", g.add_constant(name + "_bias", bias.reshape(-1) * factor)],
                            [name + "_biased"], name=name + "_bias_add"),
           helper.make_node("Reshape", [name + "_biased", reshape.input[1]], [last.output[0]], name=name + "_reshape",
                            **{a.name: helper.get_attribute_value(a) for a in reshape.attribute})]
    return [matmul, reshape, *matched], new


def _sibling_matmuls(g):
    """Products of one input by constant kernels, each with its constant bias (attention's query, key and value):
    one MatMul by the kernels side by side, one Add and a Split."""
    from onnx import helper

    siblings = collections.defaultdict(list)
    for node in g.graph.node:
        kernel = g.constant(node.input[1]) if node.op_type == "MatMul" else None
        add = g.only(node.output[0], "Add") if kernel is not None and kernel.ndim == 2 else None
        bias = g.constant(_other(add, node.output[0])) if add else None
        if bias is not None and bias.shape == kernel.shape[1:] and bias.dtype == kernel.dtype:
            siblings[node.input[0]].append((node, add, kernel, bias))
    matches = []
    for source, group in siblings.items():
        if len(group) < 2 or len({kernel.dtype for _, _, kernel, _ in group}) != 1:
            continue
        name = group[0][0].output[0].split(":")[0] + "_siblings"
        kernel = g.add_constant(name + "_kernel", np.concatenate([kernel for _, _, kernel, _ in group], axis=1))
        bias = g.add_constant(name + "_bias", np.concatenate([bias for *_, bias in group]))
        sizes = g.add_constant(name + "_sizes", np.array([k.shape[1] for _, _, k, _ in group], np.int64))
        matches.append(([node for member in group for node in member[:2]], [
            helper.make_node("MatMul", [source, kernel], [name + "_product"], name=name + "_matmul"),
            helper.make_node("Add", [name + "_product", bias], [name + "_biased"], name=name + "_bias_add"),
            helper.make_node("Split", [name + "_biased", sizes], [add.output[0] for _, add, _, _ in group],
                             name=name + "_split", axis=-1)]))
    return matches


def _save(onnx_bytes, folder):
    with open(os.path.join(folder, FILE), "wb") as f:
        f.write(onnx_bytes)
    return os.path.join(folder, FILE)


def export_onnx(model, output_dir, verify_images, labels=None, metadata=None):
    """Converts `model`, checks the file in ONNX Runtime against Keras, and writes it with labels and metadata.

    Args:
        model: a keras_vit classifier with a fixed-size image input.
        output_dir: str or path. Must not exist; written under a temporary
            name beside it, renamed last.
        verify_images: float32 `(n, height, width, channels)` real images,
            scaled as the model takes them.
        labels: optional class names, one per output, written to `labels.txt`.
        metadata: optional JSON-serialisable dict merged into `metadata.json`.

    Returns:
        dict: the check's numbers, `output_dir` and `onnx_path`.

    Raises:
        common.ToleranceError: the file is not within `common.FLOAT_TOLERANCE` of Keras;
            nothing was written.
        ValueError: an argument is not what the export takes.
    """
    import onnxruntime
    import tf2onnx

    ours = {"format": "onnx", "opset": OPSET, "tf2onnx": tf2onnx.__version__, "onnxruntime": onnxruntime.__version__}
    result = common.write_checked(model, output_dir, verify_images, labels, metadata, ours=ours, kind="ONNX",
                                  convert=convert, save=_save, client=CLIENT, runtime="ONNX Runtime")
    path = result.pop("path")
    return {**result, "onnx_path": path}


def from_command_line(model, request):
    """`python -m export --format=onnx`: writes the file and prints its check."""
    result = export_onnx(model, request.output, request.images, labels=request.labels, metadata=request.metadata)
    print(common.check_line(result, f"ONNX model written to {result['onnx_path']}",
                            "ONNX Runtime's CPU provider, in a fresh process"))
