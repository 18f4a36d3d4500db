"""Command-line tests' helper: several commands in processes started together."""

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
