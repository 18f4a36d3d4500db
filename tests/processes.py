"""Command-line tests' helper: several commands in processes started together."""

import socket
import subprocess


def run_together(commands, timeout=600, envs=None, **popen_kwargs):
    """Runs each command (an argv list) in its own process, all started at once; their CompletedProcesses, in order.

    For tests whose commands each pay TensorFlow's import, mostly single-threaded: the cores share them.
    `envs`, one environment per command, replaces a shared `env`.
    """
    envs = envs or [popen_kwargs.pop("env", None)] * len(commands)
    started = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                **popen_kwargs) for command, env in zip(commands, envs, strict=True)]
    results = []
    for process in started:
        stdout, stderr = process.communicate(timeout=timeout)
        results.append(subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr))
    return results


def closed_port():
    """A port on 127.0.0.1 that nobody listens on (bound, then released): a connection to it is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def unreachable_network(env):
    """`env` with every http(s) request sent through a proxy on a closed local port.

    urllib and huggingface_hub read these variables: their requests are refused at once, as offline, while the
    URLs they name stay the real ones.
    """
    proxy = f"http://127.0.0.1:{closed_port()}"
    cleared = {key: value for key, value in env.items() if key not in ("HF_HUB_OFFLINE", "HF_ENDPOINT")}
    return {**cleared, **{name: proxy for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")},
            "no_proxy": "", "NO_PROXY": ""}
