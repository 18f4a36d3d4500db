"""Command-line tests' helper: several commands in processes started together."""

import subprocess


def run_together(commands, timeout=600, **popen_kwargs):
    """Runs each command (an argv list) in its own process, all started at once; their CompletedProcesses, in order.

    For tests whose commands each pay TensorFlow's import: on two cores, about half the wall time.
    """
    started = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen_kwargs)
               for command in commands]
    results = []
    for process in started:
        stdout, stderr = process.communicate(timeout=timeout)
        results.append(subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr))
    return results
