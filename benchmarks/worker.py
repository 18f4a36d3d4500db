"""One implementation's benchmark process, driven by `benchmarks.run` over pipes.

    python -m benchmarks.worker --impl=keras_vit|keras_vit_served|timm|onnxruntime|openvino --threads=N

Reads one JSON request per line on stdin and answers one JSON line on stdout:

    {"op": "versions"}                              -> {"versions": {...}}
    {"op": "prepare", "name": K, "task": "inference"|"training"|"matmul"|
     "numpy_matmul", **arguments}                   -> {"first_call_s": s}
    {"op": "time", "name": K, "seconds": s}         -> {"seconds_per_call": s}
    {"op": "release", "name": K}                    -> {}
    {"op": "peak_rss"}                              -> {"peak_rss_mb": MB}

Errors answer {"error": message}; end of input ends the process. Keeping each
implementation in its own long-lived process lets the runner alternate them
round by round without either framework's threads or memory touching the other.
"""

import argparse
import importlib
import json
import resource
import sys
import time
import traceback

import numpy as np

from benchmarks.common import time_calls

SIDES = {"keras_vit": "benchmarks.keras_side", "timm": "benchmarks.timm_side",
         "keras_vit_served": "benchmarks.served_side", "onnxruntime": "benchmarks.onnxruntime_side",
         "openvino": "benchmarks.openvino_side", "keras_vit_openvino": "benchmarks.served_openvino_side",
         "keras_vit_onnxruntime": "benchmarks.served_onnxruntime_side"}


def numpy_matmul(m, k, n, dtype="float32"):
    """numpy's BLAS: a third opinion on the machine's matmul limit."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((m, k), dtype=dtype), rng.standard_normal((k, n), dtype=dtype)
    return lambda: a @ b


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


class Worker:
    def __init__(self, side):
        self.side = side
        self.calls = {}

    def versions(self):
        return {"versions": self.side.versions()}

    def prepare(self, name, task, **arguments):
        call = (numpy_matmul if task == "numpy_matmul" else getattr(self.side, task))(**arguments)
        start = time.perf_counter()
        call()  # the first call traces and compiles
        self.calls[name] = call
        return {"first_call_s": time.perf_counter() - start}

    def time(self, name, seconds):
        return {"seconds_per_call": time_calls(self.calls[name], seconds)}

    def release(self, name):
        del self.calls[name]
        return {}

    def peak_rss(self):
        return {"peak_rss_mb": peak_rss_mb()}


def serve(worker, lines, reply):
    for line in lines:
        request = json.loads(line)
        op = request.pop("op")
        try:
            answer = getattr(worker, op)(**request)
        except Exception as exc:  # reported to the runner, which names the request
            answer = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        reply(json.dumps(answer))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", choices=sorted(SIDES), required=True)
    parser.add_argument("--threads", type=int, required=True)
    args = parser.parse_args()
    side = importlib.import_module(SIDES[args.impl])
    side.set_threads(args.threads)
    # Answers go to the real stdout; anything the frameworks print goes to stderr.
    out, sys.stdout = sys.stdout, sys.stderr

    def reply(text):
        out.write(text + "\n")
        out.flush()
    serve(Worker(side), sys.stdin, reply)


if __name__ == "__main__":
    main()
