"""What every benchmark here shares: the machine's own matmul limit, FLOP
counts, timing rounds and the JSON/table output.

The machine's speed drifts (about +-20% from second to second), so every
timing round also times a float32 GEMM of a ViT shape, and figures are
reported as a fraction of that same-round GEMM throughput.
"""

import datetime
import json
import os
import pathlib
import platform
import statistics
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
    """Calls `fn` repeatedly for about `seconds`; returns seconds per call."""
    fn()
    runs, start = 0, time.perf_counter()
    while runs < 2 or time.perf_counter() - start < seconds:
        fn()
        runs += 1
    return (time.perf_counter() - start) / runs


def alternate_rounds(calls, images_per_call, flops_per_call, rounds, seconds):
    """Times `calls` (name -> callable) in alternating rounds, each with a GEMM.

    Returns name -> {"images_per_s", "fraction_of_gemm", "gemm_gflops"}, each
    summarised as median, min and max over the rounds.
    """
    samples = {name: [] for name in calls}
    for _ in range(rounds):
        gemm = gemm_gflops()
        for name, call in calls.items():
            per_call = time_calls(call, seconds)
            samples[name].append({"images_per_s": images_per_call / per_call,
                                  "fraction_of_gemm": flops_per_call / per_call / 1e9 / gemm,
                                  "gemm_gflops": gemm})
    return {name: {key: summarize([r[key] for r in rows]) for key in rows[0]} for name, rows in samples.items()}


def summarize(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def machine():
    model = next(
        (line.split(":", 1)[1].strip() for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines()
         if line.startswith("model name")),
        platform.processor(),
    ) if pathlib.Path("/proc/cpuinfo").exists() else platform.processor()
    return {"cpu": model, "cores": os.cpu_count(), "python": platform.python_version(),
            "date": datetime.date.today().isoformat()}


def write_json(path, payload):
    """Writes `payload` to `path` atomically (temporary name, then rename)."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2))
    os.replace(tmp, path)


def print_table(rows, columns):
    widths = [max(len(c), *(len(str(r[c])) for r in rows)) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    for row in rows:
        print("  ".join(str(row[c]).ljust(w) for c, w in zip(columns, widths)))


def xla_rows(results, first_key, first_label):
    """Table rows of XLA-off/on measurements: rate, share of GEMM, first call."""
    rows = []
    for r in results:
        for mode in ("xla_off", "xla_on"):
            m, rate = r[mode], r[mode]["images_per_s"]
            rows.append({
                "variant": r["variant"], "batch": r["batch"], "xla": mode[4:],
                "images/s (median, min-max)": f"{rate['median']:.1f} ({rate['min']:.1f}-{rate['max']:.1f})",
                "of GEMM": f"{m['fraction_of_gemm']['median']:.0%}",
                "GEMM GFLOP/s": f"{m['gemm_gflops']['median']:.0f}",
                first_label: f"{m[first_key]:.1f}",
            })
    return rows
