"""The `tf.distribute` strategy a run asks for, or the best one that exists.

`auto` picks a TPU when one resolves, else MultiWorkerMirroredStrategy when
TF_CONFIG names several tasks (chief and workers; each host's GPUs take part),
else MirroredStrategy over the GPUs, else the default strategy on the CPU.
Asking for a device that is not there fails at once with a message that says so.
TensorFlow is imported when a strategy is made, so the trainer's flags check
`--strategy` against `STRATEGIES` before it starts.
"""

import json
import os

STRATEGIES = ("auto", "tpu", "gpu", "multi_worker", "cpu")
# The kinds `make_strategy` returns that run bfloat16 and XLA by default ("auto").
ACCELERATORS = ("tpu", "gpu")


def _tpu(tpu):
    import tensorflow as tf

    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu or None)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except (ValueError, RuntimeError, OSError, tf.errors.OpError) as error:  # OSError: no metadata server
        raise RuntimeError(
            f"--strategy=tpu but no TPU could be reached (tpu={tpu!r}): {error}. "
            "Run on a TPU VM or pass --tpu=NAME, or use --strategy=auto|gpu|cpu."
        ) from error
    return tf.distribute.TPUStrategy(resolver)


def _workers():
    """The chief and worker tasks TF_CONFIG names (0 without it); ValueError naming TF_CONFIG if malformed."""
    text = os.environ.get("TF_CONFIG", "") or "{}"
    try:
        cluster = json.loads(text).get("cluster", {})
        return sum(len(cluster.get(job, [])) for job in ("chief", "worker"))
    except (json.JSONDecodeError, AttributeError, TypeError):
        raise ValueError("TF_CONFIG must be JSON like {\"cluster\": {\"chief\": [...], \"worker\": "
                         "[\"host:port\", ...]}, "
                         f"\"task\": {{\"type\": \"worker\", \"index\": 0}}}}; received TF_CONFIG={text!r}") from None


def make_strategy(name="auto", tpu=""):
    """Returns `(strategy, kind)` with kind in tpu, gpu, multi_worker, cpu."""
    import tensorflow as tf

    if name not in STRATEGIES:
        raise ValueError(f"`strategy` must be one of {STRATEGIES}; received strategy={name!r}")
    if name == "tpu" or (name == "auto" and (tpu or os.environ.get("TPU_NAME"))):
        return _tpu(tpu or os.environ.get("TPU_NAME", "")), "tpu"
    # Before the GPUs: on a cluster of GPU hosts, MirroredStrategy would train each host alone.
    workers = _workers() if name in ("auto", "multi_worker") else 0
    if name == "multi_worker" or (name == "auto" and workers > 1):
        if not workers:
            raise RuntimeError("--strategy=multi_worker needs TF_CONFIG naming the cluster's workers.")
        return tf.distribute.MultiWorkerMirroredStrategy(), "multi_worker"
    gpus = tf.config.list_physical_devices("GPU") if name in ("auto", "gpu") else []
    if name == "gpu" or (name == "auto" and gpus):
        if not gpus:
            raise RuntimeError("--strategy=gpu but TensorFlow sees no GPU; use --strategy=auto or cpu.")
        return tf.distribute.MirroredStrategy(), "gpu"
    return tf.distribute.get_strategy(), "cpu"
