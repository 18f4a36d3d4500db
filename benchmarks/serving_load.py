"""One export under many clients at once, as TF Serving runs it: answers, refusals, memory and deadlock.

TF Serving answers many clients' requests concurrently on one loaded model.
Here N client threads (default 8) send a fixed mix of good and bad requests
for a fixed time through one `export.capi.SavedModelSession`: TensorFlow's C
API, TF Serving's `LoadSavedModel` and `Session::Run`. ctypes releases the GIL
for the C call, so the requests run at once in TensorFlow's own thread pools.

Each kind of request is first run alone (the serial answer); under load,
every good request must give exactly its serial answer and every bad one
InvalidArgument, as alone. The process's resident memory after the run must
stay within `MEMORY_BOUND_MIB` of its memory after a concurrent warm-up (the
warm-up grows malloc's per-thread arenas and TensorFlow's caches once; a leak
per request grows on), and every client must finish within a timeout (no
deadlock). Prints requests/s and p50/p99 per kind, and writes JSON.

    python -m benchmarks.serving_load [--variant=Ti/16] [--threads=8] [--seconds=20]
"""

import collections
import os
import tempfile
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from export import capi  # noqa: E402

# Resident memory may grow this much from the warm-up's end to the run's end. The warm-up runs every
# kind of request on every client thread, so what grows after it grows per request: 10,000 requests
# leaking 1 KiB each pass the bound at 10 MiB of the 32.
MEMORY_BOUND_MIB = 32
INVALID_ARGUMENT = 3
# The largest width x height a request image may declare in the export under load: above the exporter's
# warm-up images for a 224 px model, and small, so that an oversized image is cheap to make and to refuse.
MAX_IMAGE_PIXELS = 512 * 512


def encoded(pixels, kind):
    import tensorflow as tf

    return (tf.io.encode_jpeg if kind == "jpeg" else tf.io.encode_png)(pixels).numpy()


def _photo(height, width, seed):
    rng = np.random.default_rng(seed)
    y, x = np.meshgrid(np.linspace(0, 1, height), np.linspace(0, 1, width), indexing="ij")
    pixels = np.stack([x, y, 1 - x * y], -1) * 200 + rng.normal(0, 20, (height, width, 3))
    return np.clip(pixels, 0, 255).astype(np.uint8)


def make_requests(image_size, mean=(0.5,), std=(0.5,)):
    """`{kind: (signature, inputs, good)}`: the mix the clients send, good and bad, for a 3-channel export."""
    height, width = image_size
    jpeg, png = encoded(_photo(height + 7, width + 3, 0), "jpeg"), encoded(_photo(height - 1, width + 5, 1), "png")
    strings = lambda *items: np.array(items, dtype=object)  # noqa: E731
    scaled = (_photo(height, width, 2)[None].astype(np.float32) / 255 - np.float32(mean)) / np.float32(std)
    oversized = encoded(np.zeros((513, 512, 3), np.uint8), "png")  # > MAX_IMAGE_PIXELS: refused by its header
    return {
        "jpeg": ("serving_default", {"images": strings(jpeg)}, True),
        "png and jpeg": ("serving_default", {"images": strings(png, jpeg)}, True),
        "empty batch": ("serving_default", {"images": strings()}, True),
        "pixels": ("predict_pixels", {"pixels": _photo(height + 2, width, 3)[None]}, True),
        "float": ("predict_float", {"inputs": scaled.astype(np.float32)}, True),
        "embeddings": ("embeddings", {"images": strings(png)}, True),
        "cut jpeg": ("serving_default", {"images": strings(jpeg[: len(jpeg) // 2])}, False),
        "not an image": ("serving_default", {"images": strings(b"<html>404 Not Found</html>")}, False),
        "oversized": ("serving_default", {"images": strings(oversized)}, False),
        "good and corrupt": ("serving_default", {"images": strings(png, b"\xff\xd8\xff" + b"\0" * 40)}, False),
        "raw pixels as float": ("predict_float", {"inputs": _photo(height, width, 4)[None].astype(np.float32)},
                                False),
        "wrong rank": ("predict_float", {"inputs": np.zeros((height, width, 3), np.float32)}, False),
    }


def outcome(session, signature, inputs):
    """The outputs of one request, or its TFError."""
    try:
        return session.run(signature, **inputs)
    except capi.TFError as error:
        return error


def same(first, second):
    """Whether two outcomes are one: equal outputs, bit for bit, or errors of one code and message."""
    if isinstance(first, capi.TFError) or isinstance(second, capi.TFError):
        return (isinstance(first, capi.TFError) and isinstance(second, capi.TFError)
                and (first.code, first.message) == (second.code, second.message))
    return first.keys() == second.keys() and all(np.array_equal(first[k], second[k]) for k in first)


def serial_answers(session, requests):
    """Each kind's outcome run alone; raises ValueError where a good kind fails or a bad one is not refused."""
    answers = {}
    for kind, (signature, inputs, good) in requests.items():
        answers[kind] = outcome(session, signature, inputs)
        refused = isinstance(answers[kind], capi.TFError)
        if good and refused or not good and (not refused or answers[kind].code != INVALID_ARGUMENT):
            raise ValueError(f"Request {kind!r} alone must be {'answered' if good else 'InvalidArgument'}; "
                             f"received {answers[kind]!r}"[:2000])
    return answers


def resident_mib():
    """This process's resident memory (VmRSS), MiB."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def _client(session, requests, answers, deadline, first, log):
    kinds = list(requests)
    k = first
    while time.perf_counter() < deadline:
        kind = kinds[k % len(kinds)]
        k += 1
        signature, inputs, _ = requests[kind]
        start = time.perf_counter()
        try:
            matched = same(outcome(session, signature, inputs), answers[kind])
        except Exception:  # anything but an answer or a TFError (a crash in the client) is a mismatch too
            matched = False
        log.append((kind, time.perf_counter() - start, matched))


def load(session, requests, answers, threads, seconds):
    """`threads` clients for `seconds`; returns {"per_kind", "hung", "seconds"}: per kind, latencies and mismatches.

    Client i starts at kind i, so every kind runs beside others from the start.
    """
    logs = [[] for _ in range(threads)]
    deadline = time.perf_counter() + seconds
    clients = [threading.Thread(target=_client, args=(session, requests, answers, deadline, i, logs[i]), daemon=True)
               for i in range(threads)]
    start = time.perf_counter()
    for client in clients:
        client.start()
    for client in clients:  # a request in flight at the deadline still finishes: a generous grace
        client.join(timeout=max(0.0, deadline - time.perf_counter()) + 30.0)
    elapsed = time.perf_counter() - start
    per_kind = collections.defaultdict(lambda: {"latencies": [], "mismatches": 0})
    for kind, latency, matched in (entry for log in logs for entry in log):
        per_kind[kind]["latencies"].append(latency)
        per_kind[kind]["mismatches"] += not matched
    return {"per_kind": dict(per_kind), "hung": sum(client.is_alive() for client in clients), "seconds": elapsed}


def run(session, threads=8, seconds=20.0, warmup_seconds=2.0, image_size=(224, 224), mean=(0.5,), std=(0.5,)):
    """The whole check on a loaded export (`capi.SavedModelSession`); returns the report (module docstring)."""
    requests = make_requests(image_size, mean, std)
    answers = serial_answers(session, requests)
    warm = load(session, requests, answers, threads, warmup_seconds)
    before = resident_mib()
    result = load(session, requests, answers, threads, seconds)
    after = resident_mib()
    kinds = {}
    for kind, entry in sorted(result["per_kind"].items()):
        milliseconds = sorted(1e3 * t for t in entry["latencies"])
        kinds[kind] = {"good": requests[kind][2], "count": len(milliseconds), "mismatches": entry["mismatches"],
                       "p50_ms": float(np.percentile(milliseconds, 50)),
                       "p99_ms": float(np.percentile(milliseconds, 99))}
    count = sum(k["count"] for k in kinds.values())
    return {
        "threads": threads, "seconds": result["seconds"], "requests": count,
        "requests_per_s": count / result["seconds"],
        "mismatches": sum(k["mismatches"] for k in kinds.values()) + sum(
            e["mismatches"] for e in warm["per_kind"].values()),
        "hung_clients": result["hung"] + warm["hung"],
        "resident_mib_after_warmup": before, "resident_mib_after_run": after,
        "memory_bound_mib": MEMORY_BOUND_MIB, "sent": sorted(requests), "kinds": kinds,
    }


def problems(report):
    """What the report breaks of the module docstring's promises, as sentences (none: it passed)."""
    found = []
    if report["hung_clients"]:
        found.append(f"{report['hung_clients']} client(s) never finished (deadlock?)")
    if report["mismatches"]:
        wrong = {k: v["mismatches"] for k, v in report["kinds"].items() if v["mismatches"]}
        found.append(f"{report['mismatches']} answer(s) under load differ from the serial answer: {wrong}")
    grown = report["resident_mib_after_run"] - report["resident_mib_after_warmup"]
    if grown > MEMORY_BOUND_MIB:
        found.append(f"resident memory grew {grown:.1f} MiB during the run, more than {MEMORY_BOUND_MIB} MiB")
    unsent = sorted(set(report["sent"]) - set(report["kinds"]))
    if unsent:
        found.append(f"kinds never sent under load: {unsent}")
    return found


def rows(report):
    return [{"request": kind, "good": "yes" if v["good"] else "no (InvalidArgument)", "count": v["count"],
             "p50 ms": f"{v['p50_ms']:.1f}", "p99 ms": f"{v['p99_ms']:.1f}", "mismatches": v["mismatches"]}
            for kind, v in report["kinds"].items()]


def main(argv):
    del argv
    values = flags.FLAGS
    import tensorflow as tf

    import keras_vit
    from benchmarks import common
    from export import saved_model

    model = keras_vit.ViT(keras_vit.decode_variant(values.variant))
    with tempfile.TemporaryDirectory() as folder:
        path = saved_model.export_saved_model(model, folder, max_image_pixels=MAX_IMAGE_PIXELS)
        session = capi.SavedModelSession(path)
        report = run(session, values.threads, values.seconds, image_size=model.vit_config.image_size)
        session.close()
    common.print_table(rows(report), list(rows(report)[0]))
    print(f"{report['requests']} requests in {report['seconds']:.1f} s from {report['threads']} clients: "
          f"{report['requests_per_s']:.1f} requests/s; resident memory {report['resident_mib_after_warmup']:.0f} "
          f"MiB after warm-up, {report['resident_mib_after_run']:.0f} MiB after the run")
    found = problems(report)
    common.write_json(values.out, {"machine": common.machine(), "tensorflow": tf.__version__,
                                   "variant": values.variant, **report, "problems": found})
    print(f"wrote {values.out}")
    if found:
        raise SystemExit("; ".join(found))


if __name__ == "__main__":
    # Defined here, not on import: the short test imports this module beside the trainer, whose flags share names.
    flags.DEFINE_string("variant", "Ti/16", "ViT variant (random weights: the answers are compared, not judged).")
    flags.DEFINE_integer("threads", 8, "Client threads.")
    flags.DEFINE_float("seconds", 20.0, "Seconds of load, after a warm-up of 2.")
    flags.DEFINE_string("out", "benchmarks/results/serving_load_cpu.json", "Where to write the JSON.")
    app.run(main)
