"""README.md and docs/*.md run as written: every fenced block, in document order, in a user's folder.

tests/docs_blocks.py parses the blocks and holds the one substitution table; the stand-ins below are
the files a reader brings (a checkpoint, a photo): real files of the documented kind, made here because
the machine has no network. A block that cannot run here says so above its fence and names the test
that stands in for it; the REST and gRPC examples run verbatim against TF Serving's C++ loader, and OVMS's against
OpenVINO's runtime, behind `tests/serving_stand_in.py`.
"""

import ast
import contextlib
import os
import re
import socket
import subprocess
import sys
import time
from concurrent import futures

import pytest

from tests import docs_blocks
from tests.docs_blocks import DOCS, ROOT

pytestmark = pytest.mark.slow

RUNNABLE = {"bash": "shell", "python": "python"}
# Names a reader supplies, given to a Python block that uses them without assigning them.
PYTHON_GIVEN = {name: "_np.random.default_rng(0).integers(0, 256, (2, 224, 224, 3), dtype=_np.uint8)"
                for name in ("uint8_images", "pixels", "images")}
# (pattern, replacement, why) for Python blocks.
PYTHON = (
    ("gs://my-bucket/", "", "no bucket here: tf.io.gfile opens gs:// paths as it opens local ones"),
)
# The documented order: the README first (its main job makes what the guides use).
ORDER = ("README.md", "docs/serving.md", "docs/analysis.md", "docs/checkpoints.md", "docs/training.md",
         "docs/performance.md")


def all_blocks():
    return [block for path in DOCS for block in docs_blocks.blocks(path)]


def test_every_block_runs_or_names_a_test_that_stands_in():
    unknown, stand_ins = [], []
    for block in all_blocks():
        if block.lang and block.lang not in RUNNABLE and block.lang not in ("text", "protobuf"):
            unknown.append(f"{block.where}: ```{block.lang}")
        if block.marker:
            path, _, name = block.marker.group("test").partition("::")
            source = ROOT / path
            if not source.is_file() or not re.search(rf"^def {re.escape(name)}\(", source.read_text(), re.M):
                stand_ins.append(f"{block.where}: {block.marker.group('test')}")
    assert not unknown, f"blocks in a language the docs test does not run: {unknown}"
    assert not stand_ins, f"stand-in tests that do not exist: {stand_ins}"
    assert set(ORDER) == {str(p.relative_to(ROOT)) for p in DOCS if docs_blocks.blocks(p)}, "add the doc to ORDER"


def test_shell_commands_split_and_substitute():
    text = "# a comment\npython -m x \\\n  --a=1   # trailing\npython -c \"\nprint(1)\"\n"
    assert docs_blocks.commands(text) == ["python -m x    --a=1   # trailing", 'python -c "\nprint(1)"']
    main_job = ("python3 -m venv .venv && .venv/bin/pip install -q -e '.[train]' && "
                ".venv/bin/python -m trainers.train --model_dir=runs/digits")
    assert docs_blocks.substituted(main_job).startswith("python -m trainers.train --model_dir=runs/digits --train_")
    assert docs_blocks.substituted("python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]' && "
                                   ".venv/bin/python -m pytest -q") is None


def test_a_guide_block_left_to_the_readme_repeats_its_commands():
    """A guide's block that repeats the README's commands (the digits export, the digit PNGs) is left to the README's
    run: each of its commands, after the substitution table (which gives the guide's serving folder the README's
    name), is one of the README's run commands, but for its comment."""
    def run_commands(block):
        return [re.sub(r"\s+#[^'\"]*$", "", docs_blocks.substituted(c)) for c in docs_blocks.commands(block.text)
                if docs_blocks.substituted(c) is not None]

    readme = {c for b in docs_blocks.blocks(ROOT / "README.md") if b.lang == "bash" and not b.marker
              for c in run_commands(b)}
    left = [b for b in all_blocks() if b.marker and b.marker.group("test").endswith(
        "::test_a_guide_block_left_to_the_readme_repeats_its_commands")]
    assert {b.where.split(":")[0] for b in left} == {"docs/serving.md"} and len(left) == 2
    for block in left:
        assert run_commands(block) and set(run_commands(block)) <= readme, (block.where, run_commands(block))


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    """A user's working folder with the files the docs assume, and `python` on PATH."""
    folder = tmp_path_factory.mktemp("user")
    bin_dir, keras_home = folder / ".bin", folder / ".keras"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')  # a link would leave the venv
    (bin_dir / "python").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "KERAS_HOME": str(keras_home),
           "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("KERAS_BACKEND", None)
    subprocess.run([sys.executable, "-c", STAND_INS, str(folder), str(keras_home)], check=True, env=env,
                   cwd=ROOT, timeout=600)
    return folder, env


# The files a reader brings, of the documented kinds: random weights in the real architectures and formats.
STAND_INS = r"""
import os, pathlib, shutil, sys
import numpy as np, tensorflow as tf
import keras_vit
from keras_vit.checkpoints import pretrained

folder, keras_home = map(pathlib.Path, sys.argv[1:])
os.chdir(folder)
b16 = keras_vit.ViT_B16()
keras_vit.save_npz(b16, "ViT-B_16.npz")                                           # an official B/16 file
(folder / "imagenet21k").mkdir()
keras_vit.save_npz(keras_vit.ViT_B16(classes=21843, representation_size=768), "imagenet21k/ViT-B_16.npz")
keras_vit.save_npz(keras_vit.ViT_Ti16(), "ViT-Ti_16.npz")                          # the README's fine-tuning
for variant, tag, local in (("B/16", "augreg_in21k_ft_in1k", "ViT-B_16.npz"),
                            ("B/16", "imagenet21k", "imagenet21k/ViT-B_16.npz"),
                            ("Ti/16", "augreg_in21k_ft_in1k", "ViT-Ti_16.npz")):
    cached = pretrained.cache_path(pretrained.resolve(variant, tag).url)          # as if fetched once
    cached.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(folder / local, cached)
fixtures = pathlib.Path(os.environ["PYTHONPATH"]) / "tests" / "fixtures"
shutil.copytree(fixtures / "timm" / "deit", "hf/deit_tiny_patch16_224")           # a timm hub folder
rng = np.random.default_rng(0)
tf.io.write_file("photo.jpg", tf.io.encode_jpeg(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)))
tf.io.write_file("digit.png", tf.io.encode_png(rng.integers(0, 17, (8, 8, 1), dtype=np.uint8) * 15))
os.symlink("runs/digits/model.keras", "model.keras")                             # the main job's model
for split, count in (("train", 8), ("test", 2)):                                  # a reader's photos
    for k, label in enumerate(("cat", "dog", "owl")):
        (folder / "my_images" / split / label).mkdir(parents=True)
        for i in range(count):
            size = rng.integers(40, 300, 2)
            pixels = np.clip(rng.normal(60 + 60 * k, 40, (*size, 3)), 0, 255).astype(np.uint8)
            tf.io.write_file(f"my_images/{split}/{label}/{label}_{i}.jpg", tf.io.encode_jpeg(pixels))
"""


def run_shell(command, folder, env, where):
    result = subprocess.run(["bash", "-c", command], cwd=folder, env=env, capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, (f"{where}: `{command}` failed ({result.returncode}):\n"
                                    f"{result.stdout[-1500:]}\n{result.stderr[-3000:]}")
    return result


def python_program(block):
    text = block.text
    for old, new, _ in PYTHON:
        text = text.replace(old, new)
    assigned = {node.id for node in ast.walk(ast.parse(text)) if isinstance(node, ast.Name)
                and isinstance(node.ctx, ast.Store)}
    given = [f"{name} = {value}" for name, value in PYTHON_GIVEN.items()
             if name not in assigned and re.search(rf"\b{name}\b", text)]
    prelude = "import numpy as _np\n" + "\n".join(given) + "\ndel _np\n" if given else ""
    return prelude + text


def run_block(block, folder, env):
    if block.lang == "bash":
        for command in docs_blocks.commands(block.text):
            command = docs_blocks.substituted(command)
            if command is not None:
                run_shell(command, folder, env, block.where)
    else:
        result = subprocess.run([sys.executable, "-c", python_program(block)], cwd=folder, env=env,
                                capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, f"{block.where}: the block failed:\n{result.stderr[-3000:]}"


def test_readme_and_guides_run_in_order(user):
    """The README's main job first (everything after uses its model); then the shell blocks in order, and beside
    them the Python blocks in order (no Python block reads what a later shell block writes)."""
    folder, env = user
    runnable = [block for name in ORDER for block in docs_blocks.blocks(ROOT / name)
                if block.lang in RUNNABLE and not block.marker]
    main_job, rest = runnable[0], runnable[1:]
    assert "trainers.train" in main_job.text, "the README's first block is its main job"
    ran = {}

    def lane(blocks):
        for block in blocks:
            started = time.monotonic()
            run_block(block, folder, env)
            ran[block.where] = round(time.monotonic() - started, 1)

    lane([main_job])
    with futures.ThreadPoolExecutor(2) as pool:
        lanes = [pool.submit(lane, [b for b in rest if b.lang == lang]) for lang in ("bash", "python")]
        for done in lanes:
            done.result()  # re-raises a block's failure
    print("\n".join(f"{where}: {seconds} s" for where, seconds in ran.items()))
    assert len(ran) == len(runnable) and (folder / "runs/digits/model.keras").is_file()


def test_a_block_that_drifts_from_the_code_fails(user):
    folder, env = user
    block = next(b for b in docs_blocks.blocks(ROOT / "README.md") if "--inspect" in b.text)
    # The drifted command alone: the block's commands before it would export again (TensorFlow, a trace) first.
    [command] = [c for c in docs_blocks.commands(block.text) if "--inspect" in c]
    drifted = docs_blocks.Block(block.path, block.line, block.lang, command.replace("--inspect", "--inspekt") + "\n")
    with pytest.raises(AssertionError, match="inspekt"):
        run_block(drifted, folder, env)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _stand_in(base, env):
    """tests/serving_stand_in.py serving `base` (a SavedModel as TF Serving, an IR as OVMS); yields its ports."""
    rest, grpc_port = _free_port(), _free_port()
    server = subprocess.Popen([sys.executable, "-m", "tests.serving_stand_in", "--model=digits",
                               f"--base_path={base}", f"--rest_port={rest}", f"--grpc_port={grpc_port}"],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "ready", server.stderr.read()[-2000:]
        yield rest, grpc_port
    finally:
        server.kill()
        server.wait()


def _run_examples(blocks, addresses, folder, env, checks=""):
    """The REST and gRPC example blocks, verbatim but for the `addresses` ({documented: stand-in's}); `checks` runs
    after a Python block's code, in its process. Returns the Python blocks' output."""
    printed = ""
    for block in blocks:
        text = block.text
        for documented, served in addresses.items():
            text, checks = text.replace(documented, served), checks.replace(documented, served)
        if block.lang == "bash":
            for command in docs_blocks.commands(text):
                answer = run_shell(command, folder, env, block.where).stdout
                assert '"error"' not in answer and answer.strip(), f"{block.where}: {command}\n{answer}"
        else:
            program = python_program(docs_blocks.Block(block.path, block.line, block.lang, text)) + checks
            result = subprocess.run([sys.executable, "-c", program], cwd=folder, env=env, capture_output=True,
                                    text=True, timeout=300)
            assert result.returncode == 0, f"{block.where}: the block failed:\n{result.stderr[-3000:]}"
            printed += result.stdout
    return printed


def test_rest_and_grpc_examples_answer_through_the_cpp_loader(user):
    """docs/serving.md's curl and gRPC examples, verbatim but for the ports, against the exported digits."""
    folder, env = user
    base = folder / "serving/digits"  # the README's export, which the guide's first command stands for
    assert base.is_dir(), "the guides' export runs first (test_readme_and_guides_run_in_order)"
    examples = [b for b in docs_blocks.blocks(ROOT / "docs/serving.md") if "localhost:850" in b.text]
    assert {b.lang for b in examples} == {"bash", "python"}, "the REST and the gRPC examples"
    with _stand_in(base, env) as (rest, grpc_port):
        _run_examples(examples, {"localhost:8501": f"localhost:{rest}", "localhost:8500": f"localhost:{grpc_port}"},
                      folder, env)


@pytest.mark.parametrize("runtime, written", [("openvino.Core()", "openvino_digits/model.xml"),
                                               ("onnxruntime.InferenceSession", "onnx_digits/model.onnx")])
def test_the_runtime_clients_read_the_guides_exports(user, runtime, written):
    """docs/serving.md's OpenVINO and ONNX Runtime clients, verbatim, on the files its shell blocks wrote (the Python
    lane runs beside the shell lane, so these blocks wait for this test)."""
    folder, env = user
    assert (folder / written).is_file(), "the guides' export runs first"
    [block] = [b for b in docs_blocks.blocks(ROOT / "docs/serving.md") if runtime in b.text and b.lang == "python"]
    result = subprocess.run([sys.executable, "-c", python_program(block)], cwd=folder, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.fullmatch(r"logits top class \d of 10\n", result.stdout), result.stdout  # export reads logits


# After the OVMS gRPC block, in its process: its own `predict` and REST get the IR's scores as OpenVINO computes them
# here, whatever the signature name, and a wrong input name is refused as OVMS refuses it.
OVMS_CHECKS = r"""
import json as _json
import urllib.error as _urlerror
import urllib.request as _request

import openvino as _openvino

_batch = np.random.default_rng(0).uniform(-1, 1, (3, *inputs.shape[1:])).astype(np.float32)
_own = _openvino.Core().compile_model("ovms/digits/1/model.xml", "CPU", {"INFERENCE_PRECISION_HINT": "f32"})(_batch)
for _signature in ("predict_float", "serving_default", "anything"):
    np.testing.assert_allclose(predict(_signature, inputs=_batch)["scores"], _own["scores"], rtol=0, atol=1e-6)


def _post(body):
    try:
        return _json.load(_request.urlopen("http://localhost:8000/v1/models/digits:predict",
                                           _json.dumps(body).encode()))
    except _urlerror.HTTPError as error:
        return error.code, _json.load(error)


np.testing.assert_allclose(_post({"instances": _batch.tolist()})["predictions"], _own["scores"], rtol=0, atol=1e-6)
_refused = (400, {"error": "Missing input with specific name - Required input: inputs"})
assert _post({"instances": [{"images": _image} for _image in _batch.tolist()]}) == _refused
try:
    predict("predict_float", images=_batch)
except grpc.RpcError as _refusal:
    assert (_refusal.code(), _refusal.details()) == (grpc.StatusCode.INVALID_ARGUMENT, _refused[1]["error"]), _refusal
else:
    raise AssertionError("OVMS answered a request without its input `inputs`")
"""


def test_the_same_client_reaches_openvino_model_server(user):
    """docs/serving.md's OVMS examples, verbatim but for the ports, against the guide's IR in the OVMS layout its
    block makes, served by OpenVINO's runtime behind TF Serving's API as OVMS serves it (`OVMS_CHECKS`); the gRPC
    example's `predict` is the gRPC section's, and the docker command serves what the examples ask for."""
    folder, env = user
    base = folder / "ovms/digits"
    assert (base / "1/model.xml").is_file(), "the guides' blocks run first (test_readme_and_guides_run_in_order)"
    blocks = docs_blocks.blocks(ROOT / "docs/serving.md")
    examples = [b for b in blocks if re.search(r"localhost:(8000|9000)\b", b.text)]
    assert [b.lang for b in examples] == ["bash", "python"], "the REST and the gRPC examples"

    def helper(text):
        [node] = [n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == "predict"]
        return ast.get_source_segment(text, node)

    [tf_serving] = [b for b in blocks if b.lang == "python" and "localhost:8500" in b.text]
    assert helper(examples[1].text) == helper(tf_serving.text), "one client: the gRPC section's predict()"
    [docker] = [b for b in blocks if "openvino/model_server" in b.text]
    for flag in ('source="$PWD/ovms",target=/models', "--model_name digits", "--model_path /models/digits",
                 "--port 9000", "--rest_port 8000", """--plugin_config '{"INFERENCE_PRECISION_HINT": "f32"}'"""):
        assert flag in docker.text, flag
    with _stand_in(base, env) as (rest, grpc_port):
        printed = _run_examples(examples, {"localhost:8000": f"localhost:{rest}",
                                           "localhost:9000": f"localhost:{grpc_port}"}, folder, env, OVMS_CHECKS)
    assert re.fullmatch(r"logits top class \d of 10\n", printed), printed  # the README's export reads logits


def test_model_server_config_blocks_parse_as_their_protos():
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    configs = [b for b in docs_blocks.blocks(ROOT / "docs/serving.md") if "model_config_list" in b.text]
    assert configs
    for block in configs:
        text_format.Parse(block.text, model_server_config_pb2.ModelServerConfig())
