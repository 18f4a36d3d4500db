"""One progress line for the whole run: step/total, images/s, ETA, loss and learning rate.

Keras' own bar restarts with every `fit` call (one per checkpoint or
evaluation chunk), so the trainer runs `fit` silently and this callback,
which counts the optimiser's global step, reports instead. On a terminal the
line is redrawn in place; in a log (not a tty) a line is printed every 5% of
the run, so a log stays short however long the run.
"""

import datetime
import sys
import time

import keras

WIDTH = 24
LINES_PER_RUN = 20


def _step(optimizer):
    return int(keras.ops.convert_to_numpy(optimizer.iterations))


def _learning_rate(optimizer):
    return float(keras.ops.convert_to_numpy(optimizer.learning_rate))


def format_line(step, total, images_per_second, seconds_left, loss, learning_rate):
    """`step 300/4000 [==>   ]  7.5%  1234 img/s  ETA 0:01:23  loss 1.2345  lr 1.90e-03`."""
    done = int(WIDTH * step / total)
    bar = "=" * done + (">" if done < WIDTH else "") + " " * max(WIDTH - done - 1, 0)
    eta = "?" if seconds_left is None else str(datetime.timedelta(seconds=round(seconds_left)))
    rate = "?" if images_per_second is None else f"{images_per_second:.0f}"
    return (f"step {step}/{total} [{bar}] {100 * step / total:5.1f}%  {rate} img/s  "
            f"ETA {eta}  loss {loss:.4f}  lr {learning_rate:.2e}")


class RunProgress(keras.callbacks.Callback):
    """Reports progress over all of a run's `fit` calls from the optimiser's global step."""

    def __init__(self, total_steps, batch_size, stream=None):
        super().__init__()
        self.total = total_steps
        self.batch_size = batch_size
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty()
        self.every = max(total_steps // LINES_PER_RUN, 1)
        # Time and steps spent training, over all fit calls; each call's first
        # execution (compilation, pipeline start) is left out, as is evaluation.
        self.seconds, self.steps = 0.0, 0
        self.fit_start = None
        self.last_printed = None

    def on_train_begin(self, logs=None):
        self.fit_start = None

    def _rate(self, now, step):
        """Steps per second over the training time measured so far."""
        if self.fit_start is None:
            self.fit_start = (now, step)
            return self.steps / self.seconds if self.seconds else 0.0
        seconds = self.seconds + now - self.fit_start[0]
        return (self.steps + step - self.fit_start[1]) / seconds if seconds > 0 else 0.0

    def on_train_end(self, logs=None):
        if self.fit_start is not None:
            self.seconds += time.perf_counter() - self.fit_start[0]
            self.steps += _step(self.model.optimizer) - self.fit_start[1]

    def on_train_batch_end(self, batch, logs=None):
        step = _step(self.model.optimizer)
        rate = self._rate(time.perf_counter(), step)
        seconds_left = (self.total - step) / rate if rate else None
        crossed = self.last_printed is None or step // self.every > self.last_printed // self.every
        if not (self.tty or crossed or step == self.total):
            return
        # Unknown (None) until a measured execution: the first one includes compilation.
        images_per_second = rate * self.batch_size if rate else None
        line = format_line(step, self.total, images_per_second, seconds_left, float((logs or {}).get("loss", 0.0)),
                           _learning_rate(self.model.optimizer))
        self.stream.write(f"\r{line}\033[K" if self.tty else line + "\n")
        if self.tty and step == self.total:
            self.stream.write("\n")
        self.stream.flush()
        self.last_printed = step

    def message(self, text):
        """A line (an evaluation result, say) printed without breaking the bar."""
        self.stream.write(("\r\033[K" if self.tty else "") + text + "\n")
        self.stream.flush()
