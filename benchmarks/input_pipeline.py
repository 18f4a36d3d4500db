"""ImageNet-style training input pipeline throughput: keras_vit's trainer against timm's loader.

Every side reads the same synthetic ImageNet-like folder (class folders of
JPEGs of about 500x375, quality 90, made once in a temporary directory) and
produces the same training batches: inception crop to 224 (area 5-100%, aspect
3/4-4/3; resized bilinearly by keras_vit, bicubically by timm, each its
default), horizontal flip, RandAugment (2 layers, magnitude 15 on both sides),
normalisation and Mixup 0.8 with label smoothing 0.1, as float32 images and
soft labels.

- keras_vit: the trainer's own pipeline, `trainers.data.load("folder:...")` and
  `trainers.data.train_dataset`, with the deit recipe's augmentations set as
  above (tf.data; Model Garden's RandAugment and MixupAndCutmix, as trainers/augment.py mends them). Its shuffle
  buffer is 32: the deit recipe's 10,000 is a small part of ImageNet's 1.28M
  images, so its stream flows; a buffer holding this whole small epoch would
  make each epoch wait for all of it to be decoded.
- timm: `timm.data.create_loader` as timm's train.py calls it (its prefetcher:
  uint8 batches mixed in the workers by FastCollateMixup, then normalised), in
  timm's own environment (`benchmarks/requirements-peers.txt`).
- timm_plain: `create_transform` over torchvision's `ImageFolder`, a plain
  `DataLoader` and `timm.data.Mixup` on each batch, the way most users write it.

Each side runs in a process of its own pinned to `--cores` CPUs (tf.data's
private thread pool and TF's op pools sized to match; DataLoader workers =
cores), reads one epoch to warm up, then times `--epochs` more. It reports
images per second of wall time and images per CPU-second (user + system time
of the process and its loader workers): the second is the "per host core"
figure, and, unlike wall time, barely moves when other jobs share the
machine. Rounds alternate the sides (order reversed every other round), each
round starting with numpy's GEMM rate so the machine's drift shows; the ratios
are taken within a round. The target (issue: >= 1.5x timm) is on images per
CPU-second.

    python -m benchmarks.input_pipeline [--images=384] [--batch=64] [--epochs=4] [--rounds=3]
        [--cores=N] [--timm_python=PATH] [--tiny]
"""

import importlib.metadata
import json
import os
import pathlib
import sys
import tempfile
import time

import numpy as np
from absl import app, flags

from benchmarks import common

_IMAGES = flags.DEFINE_integer("images", 384, "JPEGs in the synthetic training split (a multiple of --batch).")
_CLASSES = flags.DEFINE_integer("classes", 10, "Class folders.")
_BATCH = flags.DEFINE_integer("batch", 64, "Batch size.")
_EPOCHS = flags.DEFINE_integer("epochs", 4, "Timed epochs per measurement (after one warm-up epoch).")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Alternating rounds.")
_SHUFFLE = flags.DEFINE_integer("shuffle_buffer", 32, "keras_vit's shuffle buffer (see the module docstring).")
_CORES = flags.DEFINE_integer("cores", len(os.sched_getaffinity(0)), "Host cores each side may use.")
_IMAGE_SIZE = flags.DEFINE_integer("image_size", 224, "Training resolution.")
_RA_LAYERS = flags.DEFINE_integer("randaugment_layers", 2, "RandAugment layers.")
_RA_MAGNITUDE = flags.DEFINE_integer("randaugment_magnitude", 15, "RandAugment magnitude.")
_MIXUP = flags.DEFINE_float("mixup_alpha", 0.8, "Mixup alpha (> 0).")
_CUTMIX = flags.DEFINE_float("cutmix_alpha", 0.0, "CutMix alpha (the deit recipe's is 1.0).")
_ERASING = flags.DEFINE_float("random_erasing", 0.0, "Random erasing probability (the deit recipe's is 0.25).")
_SMOOTHING = flags.DEFINE_float("label_smoothing", 0.1, "Label smoothing (the deit recipe's).")
_INTERPOLATION = flags.DEFINE_string("timm_interpolation", "bicubic",
                                     "timm's crop resize (its ViT/DeiT default; keras_vit's is bilinear).")
_TIMM_PYTHON = flags.DEFINE_string("timm_python", "", "timm's Python (default: benchmarks/.envs/timm, made once).")
_TINY = flags.DEFINE_bool("tiny", False, "A quick check: 32 small images, batch 8, 1 round of 1 epoch.")
_OUT = flags.DEFINE_string("out", "benchmarks/results/input_pipeline_cpu.json", "Where to write the JSON.")
_WORKER = flags.DEFINE_string("worker_data", "", "Internal: measure keras_vit on this folder and print JSON.")

ROOT = pathlib.Path(__file__).resolve().parent.parent
SIDES = ("keras_vit", "timm", "timm_plain")
TARGET = 1.5  # keras_vit / timm images per second per host core
SETTINGS = {
    "keras_vit": {
        "pipeline": "trainers.data.load('folder:...') + trainers.data.train_dataset (tf.data, AUTOTUNE maps)",
        "decode": "tfds ImageFolder: whole JPEG decoded before the shuffle buffer, then cropped",
        "crop": "inception: stateless_sample_distorted_bounding_box, area 5-100%, aspect 3/4-4/3; bilinear resize",
        "randaugment": "Model Garden RandAugment without Cutout: per layer one of 15 ops or identity, "
                       "applied with probability 0.2-0.8",
        "mixup": "trainers.augment.MixupAndCutmix (Model Garden's, CutMix labels mended) on each batch (a tf.data map)",
        "threads": "pinned to {cores} CPUs; tf.data private_threadpool_size={cores}, inter/intra-op threads {cores}"},
    "timm": {
        "pipeline": "timm.data.create_loader(ImageDataset, use_prefetcher=True, device=cpu), as timm's train.py",
        "decode": "PIL, whole image, in the DataLoader workers",
        "crop": "RandomResizedCropAndInterpolation, scale 0.05-1, ratio 3/4-4/3 (the recipe's)",
        "randaugment": "timm rand-mM-nN-mmaxM: per layer one of 15 ops, applied with probability 0.5",
        "mixup": "FastCollateMixup on uint8 images in the workers; PrefetchLoader normalises in the main process",
        "threads": "pinned to {cores} CPUs; DataLoader num_workers={cores} (one torch thread each)"},
    "timm_plain": {
        "pipeline": "torchvision ImageFolder + timm create_transform (float tensors, normalised) + torch DataLoader",
        "decode": "PIL, whole image, in the DataLoader workers",
        "crop": "RandomResizedCropAndInterpolation, scale 0.05-1, ratio 3/4-4/3 (the recipe's)",
        "randaugment": "timm rand-mM-nN-mmaxM: per layer one of 15 ops, applied with probability 0.5",
        "mixup": "timm.data.Mixup on each float batch in the main process",
        "threads": "pinned to {cores} CPUs; DataLoader num_workers={cores} (one torch thread each)"},
}


def make_folder(root, count, classes, scale=1.0, seed=0):
    """root/train/class_k/*.jpg: natural-ish JPEGs (smooth colour fields, texture and noise) of ~500x375.

    Flat images would decode unrealistically fast: the detail and noise give
    files of about 90 KB, near ImageNet's average, so decoding costs what it does there.
    """
    from PIL import Image

    rng = np.random.default_rng(seed)
    sizes = []
    for index in range(count):
        jitter = rng.uniform(0.9, 1.1)  # sizes vary a little; every fourth image is a portrait
        w, h = (375, 500) if index % 4 == 3 else (500, 375)
        w, h = int(w * jitter * scale), int(h * jitter * scale)
        image = rng.normal(0, 12, (h, w, 3))
        for grid_h, grid_w, amplitude in ((3, 4, 0.6), (12, 16, 0.3), (96, 128, 0.3)):
            field = Image.fromarray(rng.uniform(0, 255, (grid_h, grid_w, 3)).astype(np.uint8))
            image += amplitude * np.asarray(field.resize((w, h), Image.BICUBIC), np.float32)
        folder = pathlib.Path(root) / "train" / f"class_{index % classes:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{index:05d}.jpg"
        Image.fromarray(np.clip(image, 0, 255).astype(np.uint8)).save(path, quality=90)
        sizes.append(path.stat().st_size)
    return {"images": count, "classes": classes, "mean_kb": float(np.mean(sizes)) / 1024,
            "size": f"~{int(500 * scale)}x{int(375 * scale)} (+-10%, every 4th portrait), JPEG quality 90"}


def keras_vit_worker(folder):
    """Runs in its own process: the trainer's training stream, timed after one warm-up epoch."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    cores = _CORES.value
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:cores])
    import tensorflow as tf

    tf.config.threading.set_inter_op_parallelism_threads(cores)
    tf.config.threading.set_intra_op_parallelism_threads(cores)
    from trainers import data, recipes

    recipe = recipes.validate(recipes.RECIPES["deit"].replace(
        dataset=f"folder:{folder}", image_size=_IMAGE_SIZE.value, batch_size=_BATCH.value,
        randaugment_layers=_RA_LAYERS.value, randaugment_magnitude=float(_RA_MAGNITUDE.value),
        mixup_alpha=_MIXUP.value, cutmix_alpha=_CUTMIX.value, random_erasing=_ERASING.value,
        label_smoothing=_SMOOTHING.value, shuffle_buffer=_SHUFFLE.value))
    source = data.load(recipe.dataset, recipe.train_split)
    steps = source.num_examples // _BATCH.value  # per epoch
    ds = data.train_dataset(recipe, source, _BATCH.value, 0, steps * (1 + _EPOCHS.value))
    options = tf.data.Options()
    options.threading.private_threadpool_size = cores  # tf.data's own pool, one thread per core
    ds = ds.with_options(options)
    start = time.perf_counter()
    for step, (images, labels) in enumerate(ds):
        if step == steps - 1:  # the end of the warm-up epoch (tracing, the first shuffle buffer)
            warmup, start, cpu = time.perf_counter() - start, time.perf_counter(), time.process_time()
            shapes = [images.shape.as_list(), labels.shape.as_list()]  # every batch's: whole batches only
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu  # CPU time: all of TF's threads
    timed = steps * _EPOCHS.value * _BATCH.value
    fields = ("train_crop", "flip", "randaugment_layers", "randaugment_magnitude", "mixup_alpha", "cutmix_alpha",
              "label_smoothing", "random_erasing", "shuffle_buffer")
    print(json.dumps({
        "images_per_s": timed / seconds, "images_per_cpu_s": timed / cpu, "images": timed, "seconds": seconds,
        "cpu_seconds": cpu, "warmup_s": warmup, "batch_shapes": shapes,
        "described": {"recipe": {"base": "deit", "image_size": recipe.model.image_size[0],
                                 **{name: getattr(recipe, name) for name in fields}}},
        "versions": {name: importlib.metadata.version(name) for name in (
            "tensorflow", "tf-models-official", "tensorflow-datasets", "keras")}}))


# The peers, run by timm's Python with a JSON argument: its environment has no absl or TensorFlow.
# timm clips RandAugment magnitudes at 10 unless told otherwise (mmax); Model Garden does not.
TIMM_WORKER = r"""
import json, os, sys, time
args = json.loads(sys.argv[1])
os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:args["cores"]])
sys.path.insert(0, args["root"])
from benchmarks.timm_side import import_timm  # works around the CUDA torchvision wheel beside CPU torch

timm = import_timm()
import PIL, torch, torchvision
from timm.data import FastCollateMixup, ImageDataset, Mixup, create_loader, create_transform

def cpu_seconds(pid):
    # User + system time of `pid` (all its threads) and of its live children: the loader's workers.
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    total = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            total += sum(cpu_seconds(int(child)) for child in f.read().split())
    return total

root = os.path.join(args["folder"], "train")
augment = dict(scale=(0.05, 1.0), ratio=(3 / 4, 4 / 3), hflip=0.5, re_prob=args["random_erasing"],
               auto_augment=f"rand-m{args['magnitude']}-n{args['layers']}-mmax{args['magnitude']}",
               interpolation=args["interpolation"])
mixing = dict(mixup_alpha=args["mixup_alpha"], cutmix_alpha=args["cutmix_alpha"],
              label_smoothing=args["label_smoothing"], num_classes=len(os.listdir(root)))
if args["side"] == "timm":  # timm's train.py: its loader, prefetcher on, mixup in the collate
    loader = create_loader(ImageDataset(root), (3, args["image_size"], args["image_size"]), args["batch"],
                           is_training=True, num_workers=args["cores"], device=torch.device("cpu"),
                           use_prefetcher=True, collate_fn=FastCollateMixup(**mixing), **augment)
    mixup, transform = None, loader.loader.dataset.transform
else:
    transform = create_transform(args["image_size"], is_training=True, **augment)
    loader = torch.utils.data.DataLoader(torchvision.datasets.ImageFolder(root, transform), args["batch"],
                                         shuffle=True, drop_last=True, num_workers=args["cores"],
                                         persistent_workers=True)
    mixup = Mixup(**mixing)
start = time.perf_counter()
for epoch in range(1 + args["epochs"]):
    if epoch == 1:  # after the warm-up epoch (worker start-up)
        warmup, start, cpu = time.perf_counter() - start, time.perf_counter(), cpu_seconds(os.getpid())
    for images, labels in loader:
        if mixup is not None:
            images, labels = mixup(images, labels)
seconds, cpu = time.perf_counter() - start, cpu_seconds(os.getpid()) - cpu
timed = len(loader) * args["batch"] * args["epochs"]
print(json.dumps({
    "images_per_s": timed / seconds, "images_per_cpu_s": timed / cpu, "images": timed, "seconds": seconds,
    "cpu_seconds": cpu, "warmup_s": warmup, "batch_shapes": [list(images.shape), list(labels.shape)],
    "described": {"transform": str(transform), "images_dtype": str(images.dtype)},
    "versions": {"torch": torch.__version__, "torchvision": torchvision.__version__, "timm": timm.__version__,
                 "pillow": PIL.__version__}}))
"""


def run_json(command, side):
    return common.worker_json(command, f"the {side} worker", cwd=ROOT)


def measure(side, folder, timm_python):
    if side == "keras_vit":
        passed = [f"--{name}={flags.FLAGS[name].value}" for name in (
            "batch", "epochs", "cores", "image_size", "randaugment_layers", "randaugment_magnitude", "mixup_alpha",
            "cutmix_alpha", "random_erasing", "label_smoothing", "shuffle_buffer")]
        return run_json([sys.executable, "-m", "benchmarks.input_pipeline", f"--worker_data={folder}", *passed], side)
    args = {"side": side, "folder": str(folder), "root": str(ROOT), "cores": _CORES.value, "batch": _BATCH.value,
            "epochs": _EPOCHS.value, "image_size": _IMAGE_SIZE.value, "layers": _RA_LAYERS.value,
            "magnitude": _RA_MAGNITUDE.value, "interpolation": _INTERPOLATION.value,
            "mixup_alpha": _MIXUP.value, "cutmix_alpha": _CUTMIX.value, "label_smoothing": _SMOOTHING.value,
            "random_erasing": _ERASING.value}
    return run_json([timm_python, "-c", TIMM_WORKER, json.dumps(args)], side)


def main(argv):
    del argv
    if _WORKER.value:
        return keras_vit_worker(_WORKER.value)
    if _TINY.value:
        for name, value in (("images", 32), ("batch", 8), ("epochs", 1), ("rounds", 1)):
            flags.FLAGS[name].value = value
    if _IMAGES.value % _BATCH.value:
        raise SystemExit(f"--images must be a multiple of --batch (epochs of whole batches on every side); "
                         f"received images={_IMAGES.value}, batch={_BATCH.value}")
    from benchmarks import run

    timm_python = run.environment_python("timm", _TIMM_PYTHON.value, run.ENVS_DIR)
    cores = _CORES.value
    rounds = []
    with tempfile.TemporaryDirectory() as folder:
        dataset = make_folder(folder, _IMAGES.value, _CLASSES.value, scale=0.25 if _TINY.value else 1.0)
        for index in range(_ROUNDS.value):
            record = {"load_average_1min": os.getloadavg()[0], "gemm_gflops": common.gemm_gflops()}
            for side in SIDES if index % 2 == 0 else SIDES[::-1]:  # neither side always goes first
                record[side] = measure(side, folder, timm_python)
            for peer in SIDES[1:]:
                record[f"ratio_{peer}"] = record["keras_vit"]["images_per_s"] / record[peer]["images_per_s"]
                record[f"cpu_ratio_{peer}"] = (record["keras_vit"]["images_per_cpu_s"]
                                               / record[peer]["images_per_cpu_s"])
            rounds.append(record)
            print(f"round {index}: " + ", ".join(
                f"{side} {record[side]['images_per_s']:.0f} images/s ({record[side]['images_per_cpu_s']:.0f} per "
                f"CPU-s)" for side in SIDES) + f"; GEMM {record['gemm_gflops']:.0f} GFLOP/s, "
                f"load {record['load_average_1min']:.1f}", flush=True)
    # What each side ran and with which versions: the same in every round, kept once.
    settings, versions = {}, {}
    for side in SIDES:
        for record in rounds:
            described, versions[side] = record[side].pop("described"), record[side].pop("versions")
        settings[side] = {**SETTINGS[side], **described, "threads": SETTINGS[side]["threads"].format(cores=cores)}
    summary = {}
    for side in SIDES:
        summary[side] = {"images_per_s": common.summarize([r[side]["images_per_s"] for r in rounds]),
                         "images_per_s_per_core": common.summarize([r[side]["images_per_s"] / cores for r in rounds]),
                         "images_per_cpu_s": common.summarize([r[side]["images_per_cpu_s"] for r in rounds])}
    for key in rounds[0]:
        if key.startswith(("ratio_", "cpu_ratio_")):
            summary[key] = common.summarize([r[key] for r in rounds])
    summary["met"] = summary["cpu_ratio_timm"]["median"] >= TARGET
    rows = [{"side": side, "images/s": f"{summary[side]['images_per_s']['median']:.0f}",
             f"/ {cores} cores": f"{summary[side]['images_per_s_per_core']['median']:.0f}",
             "per CPU-second": f"{summary[side]['images_per_cpu_s']['median']:.0f}",
             "keras_vit / side (wall, per CPU-s)": "" if side == "keras_vit" else
             f"{summary['ratio_' + side]['median']:.2f}, {summary['cpu_ratio_' + side]['median']:.2f}"}
            for side in SIDES]
    common.print_table(rows, list(rows[0]))
    common.write_json(_OUT.value, {
        "machine": common.machine(), "cores_used": cores, "tiny": _TINY.value, "dataset": dataset,
        "batch": _BATCH.value, "timed_epochs": _EPOCHS.value, "timed_images": rounds[-1]["keras_vit"]["images"],
        "augmentations": {"crop": f"inception to {_IMAGE_SIZE.value}", "flip": 0.5,
                          "randaugment": f"{_RA_LAYERS.value} layers, magnitude {_RA_MAGNITUDE.value}",
                          "mixup_alpha": _MIXUP.value, "cutmix_alpha": _CUTMIX.value,
                          "label_smoothing": _SMOOTHING.value, "random_erasing": _ERASING.value,
                          "timm_interpolation": _INTERPOLATION.value},
        "settings": settings, "versions": versions, "rounds": rounds, "summary": summary,
        "target": f"keras_vit >= {TARGET}x timm's images per host core (images per CPU-second)"})
    ratio = summary["cpu_ratio_timm"]
    print(f"keras_vit / timm per host core: {ratio['median']:.2f}x (range {ratio['min']:.2f}-{ratio['max']:.2f}; "
          f"target >= {TARGET}x: {'met' if summary['met'] else 'not met'}); wrote {_OUT.value}")


if __name__ == "__main__":
    app.run(main)
