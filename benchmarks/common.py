"""What every benchmark here shares: numpy's matmul rate, FLOP counts, the
timer, and the JSON/table output. Needs only numpy: the peer's worker uses it.

The machine's speed drifts (about +-20% from second to second), so the
benchmarks time a matmul in the same rounds as the models they measure.
"""

import datetime
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time

import numpy as np


def gemm_gflops(m=8 * 197, k=768, n=3072, seconds=0.5):
    """Sustained float32 GEMM GFLOP/s of numpy's BLAS at a ViT MLP shape."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    a @ b  # warm-up
    runs, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        runs += 1
    return 2.0 * m * k * n * runs / (time.perf_counter() - start) / 1e9


def vit_forward_flops(image_size, patch_size, hidden_size, mlp_dim, num_layers, classes=1000, channels=3, **_):
    """Forward FLOPs of one image: 2 x multiply-adds of every matmul.

    Per block with T tokens, width D and MLP width M: 4 T D^2 (query, key,
    value, output) + 2 T^2 D (logits and the weighted sum) + 2 T D M (MLP).
    Plus the patch projection N p^2 C D and the head D x classes.
    """
    patches = (image_size // patch_size) ** 2
    tokens = patches + 1
    d = hidden_size
    block = 4 * tokens * d * d + 2 * tokens * tokens * d + 2 * tokens * d * mlp_dim
    macs = patches * patch_size**2 * channels * d + num_layers * block + d * classes
    return 2 * macs


def time_calls(fn, seconds):
    """Seconds per call of `fn`, repeated for about `seconds` (at least once, after a warm-up call)."""
    fn()  # warm caches after whatever ran before
    runs, start = 0, time.perf_counter()
    while runs < 1 or time.perf_counter() - start < seconds:
        fn()
        runs += 1
    return (time.perf_counter() - start) / runs


def alternating_rounds(calls, rounds, measure, rotate=False):
    """Times every call in turn, round after round, with the GEMM at the start of each round; `rotate` starts
    each round one call further on, so no call always follows the GEMM.

    Returns ({name: [measure(call) per round]}, [GEMM GFLOP/s per round]).
    """
    names, samples, gemms = list(calls), {name: [] for name in calls}, []
    for round_ in range(rounds):
        gemms.append(gemm_gflops())
        shift = round_ % len(names) if rotate else 0
        for name in names[shift:] + names[:shift]:
            samples[name].append(measure(calls[name]))
    return samples, gemms


def summarize(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def machine():
    """What a figure was measured on: a CPU's brand names several generations, so the family, model and AVX-512 too."""
    info = {}
    if pathlib.Path("/proc/cpuinfo").exists():
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    cpu = {"cpu": info.get("model name", platform.processor())}
    if "cpu family" in info:
        cpu_flags = info.get("flags", "").split()
        cpu.update(cpu_family=int(info["cpu family"]), cpu_model=int(info["model"]), avx512="avx512f" in cpu_flags,
                   isa=next((isa for isa in ("avx512f", "avx2", "avx") if isa in cpu_flags), "other").upper())
    # What held the frameworks below the CPU's ISA (isa_limits), and TensorFlow's oneDNN setting.
    settings = {name: os.environ[name] for name in (*_ISA_VARIABLES, "TF_ENABLE_ONEDNN_OPTS") if name in os.environ}
    settings.update({flag: True for flag in os.environ.get("XLA_FLAGS", "").split() if "max_isa" in flag})
    return {**cpu, "isa_settings": settings, "cores": os.cpu_count(), "gpu": _gpu_name(),
            "python": platform.python_version(), "date": datetime.date.today().isoformat()}


_ISA_VARIABLES = ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY")


def isa_limits(isa):
    """The environment that holds TensorFlow's oneDNN, XLA and PyTorch to `isa` ("AVX2"): an AVX2 CPU approximated
    on a wider one. Eigen's kernels (TensorFlow without oneDNN) are built for AVX on every CPU already."""
    xla = " ".join([*(f for f in os.environ.get("XLA_FLAGS", "").split() if "max_isa" not in f),
                    f"--xla_cpu_max_isa={isa}"])
    return {"ONEDNN_MAX_CPU_ISA": isa, "ATEN_CPU_CAPABILITY": isa.lower(), "XLA_FLAGS": xla}


def _gpu_name():
    """The first NVIDIA GPU's name, or None without one (asked of nvidia-smi: no framework loads here)."""
    try:
        listed = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if listed.returncode != 0 or not listed.stdout.strip():
        return None
    return listed.stdout.splitlines()[0].strip()


def write_json(path, payload):
    """Writes `payload` to `path` atomically (temporary name, then rename)."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")  # per process, as the trainer's: runs may share --out
    tmp.write_text(json.dumps(payload, indent=2))
    os.replace(tmp, path)


def print_table(rows, columns):
    widths = [max(len(c), *(len(str(r[c])) for r in rows)) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    for row in rows:
        print("  ".join(str(row[c]).ljust(w) for c, w in zip(columns, widths, strict=True)))


def worker_json(command, what, **run_args):
    """Runs a worker process; returns the JSON object of its last line of output, or raises naming `what`."""
    result = subprocess.run(command, capture_output=True, text=True, **run_args)
    if result.returncode:
        raise RuntimeError(f"{what} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def train_metrics(model_dir, *flags):
    """Runs `python -m trainers.train --model_dir=MODEL_DIR FLAGS...` in a fresh process; returns its metrics.json."""
    result = subprocess.run([sys.executable, "-m", "trainers.train", f"--model_dir={model_dir}", *flags],
                            capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(f"trainers.train {' '.join(flags)} failed:\n{result.stderr[-3000:]}")
    return json.loads((pathlib.Path(model_dir) / "metrics.json").read_text())


def train_digits(folder):
    """Trains the main job into `folder`; returns its model.keras."""
    subprocess.run([sys.executable, "-m", "trainers.train", f"--model_dir={folder}"], check=True,
                   stdout=subprocess.DEVNULL)
    return os.path.join(folder, "model.keras")


def read_digits(paths, model):
    """Digit PNG files read as `python -m export --images` reads them for `model`; and their labels."""
    from export import preprocessing

    steps = preprocessing.Preprocessing.for_model(model, max_image_pixels=2**31 - 1)
    return preprocessing.read_images(paths, steps), np.array([int(p[-5]) for p in paths])  # NNNN_LABEL.png
