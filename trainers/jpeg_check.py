"""JPEGs that TensorFlow decodes only in part, named by file: libjpeg's corrupt-data warnings count as failures.

A JPEG cut short and closed again with its end marker (FF D9) passes the ends
check (`trainers.image_ends`) and `tf.io.decode_jpeg` decodes it without
error: libjpeg fills the lost part grey and only prints an anonymous
`Corrupt JPEG data: premature end of data segment` on the process' stderr.
That line is the only signal TensorFlow gives, so `corrupt_jpegs` decodes
every JPEG with file descriptor 2 pointed at a temporary file and reads
libjpeg's lines back (libjpeg writes them with fprintf to C's stderr, which is
unbuffered: they are in the file when the decode returns).

The decode is cheap because it runs at `ratio=8`: libjpeg still reads all the
entropy-coded data, where the warnings come from, but skips most of the
inverse DCT, upsampling and colour work; the files are read and decoded in
parallel in one graph call per chunk of 64. A warning names no file, so a
chunk whose text holds one, or whose call failed on a decode error, is decoded
again one file at a time to name it. Text in the capture that the files do not
explain (a log line of another thread) is written back to stderr afterwards.

Limits: libjpeg prints only the first warning of a decode, so a file whose
first is a harmless one (junk bytes between segments) hides a later loss; scan
data overwritten in place with bytes that still decode (zeros, say) gives wrong
pixels with no warning, or only "N extraneous bytes before marker", which this
check takes as harmless because encoders' padding gives it too.

Not chosen: a parse of the markers alone cannot tell where the scan data should
end (its length depends on the Huffman codes: only a decode knows);
`tf.io.decode_and_crop_jpeg` stops reading below its window, so it misses a cut
under it; Pillow decodes such a file silently and is no core dependency.
"""

import contextlib
import os
import re
import sys
import tempfile
import threading

import tensorflow as tf

JPEG_MAGIC = b"\xff\xd8\xff"
CHUNK = 64
# libjpeg's warnings (jerror.h) that mean some pixels are not the file's, with what the image then looks like.
_LOST = ((re.compile(r"Corrupt JPEG data: (premature end of data segment)"), "decodes partly grey"),
         (re.compile(r"(Premature end of JPEG file)"), "decodes partly grey"),
         (re.compile(r"Corrupt JPEG data: (bad Huffman code|bad arithmetic code|found marker 0x[0-9a-f]+ instead "
                     r"of RST\d)"), "decodes partly garbled"),
         (re.compile(r"(Inconsistent progression sequence for component \d+ coefficient \d+"
                     r"|Invalid SOS parameters for sequential JPEG)"), "decodes partly garbled"))
# libjpeg's warnings that leave every pixel the file's: bytes skipped between segments, a bad ICC profile, an
# unknown JFIF revision or Adobe transform code.
_HARMLESS = re.compile(r"Corrupt JPEG data: \d+ extraneous bytes before marker 0x[0-9a-f]+"
                       r"|Corrupt JPEG data: bad ICC marker|Warning: unknown JFIF revision number \d+\.\d+"
                       r"|Unknown Adobe color transform code \d+")
# TensorFlow's C++ log line: "2026-01-31 12:00:00.123456: E tensorflow/core/lib/jpeg/jpeg_mem.cc:329] message".
_TF_LOG = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: ([IWEF] [^\]]*\] (.*))", re.DOTALL)
# fd 2 is the process's: one capture at a time.
_CAPTURE_LOCK = threading.Lock()


def lost_pixels(text):
    """The reason for a warning of libjpeg's that says some pixels are not the file's, else None."""
    for pattern, consequence in _LOST:
        match = pattern.fullmatch(text.strip())
        if match:
            detail = match.group(1)
            return f"corrupt JPEG data (libjpeg: {detail[0].lower()}{detail[1:]}): {consequence}"
    return None


def _is_libjpeg_warning(record):
    return lost_pixels(record) is not None or _HARMLESS.fullmatch(record.strip()) is not None


def _records(text):
    """The text's messages: a line, with the indented lines after it (TensorFlow continues a message so)."""
    records = []
    for line in text.splitlines():
        if records and line[:1].isspace():
            records[-1] += "\n" + line
        elif line.strip():
            records.append(line)
    return records


def _key(record):
    """A message without TensorFlow's time stamp: the same message from two decodes of one file compares equal."""
    match = _TF_LOG.fullmatch(record)
    return match.group(1) if match else record.strip()


def _tf_logged_a_jpeg_failure(record):
    """TensorFlow's log of a failed decode of a chunk ("Local rendezvous is aborting ... jpeg::Uncompress failed")."""
    return _TF_LOG.fullmatch(record) is not None and "jpeg" in record.lower()


def _flush_python_stderr():
    with contextlib.suppress(Exception):  # a closed or missing sys.stderr has nothing pending
        sys.stderr.flush()


@contextlib.contextmanager
def _stderr_into(capture_fd):
    """File descriptor 2 writes into `capture_fd` for the block, and is the process's own again after it."""
    _flush_python_stderr()  # Python's pending text goes where it was meant to
    try:
        saved = os.dup(2)
    except OSError:  # no fd 2 at all (a daemon): the capture takes its place and is closed after
        saved = None
    os.dup2(capture_fd, 2)
    try:
        yield
    finally:
        _flush_python_stderr()
        if saved is None:
            os.close(2)
        else:
            os.dup2(saved, 2)
            os.close(saved)


class _Capture:
    """A temporary file that fd 2 writes into during `run`, emptied before each run."""

    def __init__(self):
        self._file = tempfile.TemporaryFile()

    def run(self, function, *args):
        """(function's result or the OpError it raised, the messages written to fd 2 meanwhile)."""
        fd = self._file.fileno()
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        with _stderr_into(fd):
            try:
                result = function(*args)
            except tf.errors.OpError as error:
                result = error
        os.lseek(fd, 0, os.SEEK_SET)
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        return result, _records(b"".join(chunks).decode(errors="replace"))

    def close(self):
        self._file.close()


def _decode_or_pass(path):
    data = tf.io.read_file(path)
    is_jpeg = tf.equal(tf.strings.substr(data, 0, len(JPEG_MAGIC)), JPEG_MAGIC)
    # ratio=8: every byte of scan data is still entropy-decoded, which is what raises libjpeg's warnings.
    # The result depends on the pixels so that no graph optimisation can drop the decode.
    return tf.cond(is_jpeg, lambda: tf.minimum(tf.size(tf.io.decode_jpeg(data, ratio=8)), 1), lambda: 1)


# map_fn rather than tf.data: a tf.data pipeline costs ~20 ms of CPU to start, the decode of ~70 such images.
@tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
def _decode_all(paths):
    return tf.reduce_sum(tf.map_fn(_decode_or_pass, paths, parallel_iterations=16, fn_output_signature=tf.int32))


def _decoded_count(paths):
    """How many of `paths` are JPEGs (by their first bytes) that decode, or other files; raises on a decode error."""
    return int(_decode_all(tf.constant([os.fsencode(path) for path in paths], tf.string)))


def _jpeg_bytes(path):
    """The file's bytes when it starts as a JPEG does, else None (unreadable files are the header scan's)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data if data.startswith(JPEG_MAGIC) else None


def _failure(error, records):
    """Why a decode failed: libjpeg's own words (on stderr), else TensorFlow's log of it, else the error."""
    said = next((record for record in records if not _TF_LOG.fullmatch(record)), None)
    logged = next((_TF_LOG.fullmatch(record).group(2) for record in records if _TF_LOG.fullmatch(record)), None)
    message = error.message.strip()
    detail = said or logged or (message.splitlines()[-1] if message else type(error).__name__)
    return f"cannot be decoded, cut short or corrupt ({detail.strip()})"


def _file_problem(capture, path):
    """(why `path` does not decode whole or None, its decode's messages on stderr, those not about the decode)."""
    data = _jpeg_bytes(path)
    if data is None:
        return None, [], []
    result, records = capture.run(lambda: tf.io.decode_jpeg(data, ratio=8))
    if isinstance(result, tf.errors.OpError):
        return _failure(result, [record for record in records if not _is_libjpeg_warning(record)]), records, []
    reason = next((lost_pixels(record) for record in records if lost_pixels(record)), None)
    return reason, records, [record for record in records if not _is_libjpeg_warning(record)]


def _relay(records):
    """Writes back to stderr what the capture took that was not libjpeg's or TensorFlow's word on these files."""
    if records:
        os.write(2, "".join(record + "\n" for record in records).encode())


def corrupt_jpegs(paths):
    """`{path: reason}` for every JPEG among `paths` that decodes only with a corrupt-data warning, or not at all.

    A file is a JPEG by its first bytes (FF D8 FF), whatever its name; other and unreadable files are left out.
    Meant for every file of a folder before training: decodes at 1/8 scale, in parallel, with stderr (fd 2)
    captured meanwhile (what is not about these files is written back after), so call it while no other thread
    needs fd 2 at once.
    """
    paths = list(paths)
    found = {}
    with _CAPTURE_LOCK:
        capture = _Capture()
        try:
            for start in range(0, len(paths), CHUNK):
                chunk = paths[start: start + CHUNK]
                count, records = capture.run(_decoded_count, chunk)
                if count == len(chunk) and not any(lost_pixels(record) for record in records):
                    _relay([record for record in records if not _is_libjpeg_warning(record)])
                    continue
                # A warning names no file, and an error stops the chunk: decode one at a time to name the file.
                explained = set()
                for path in chunk:
                    reason, own, unexplained = _file_problem(capture, path)
                    explained.update(_key(record) for record in own)
                    _relay(unexplained)
                    if reason:
                        found[path] = reason
                _relay([record for record in records if not _is_libjpeg_warning(record)
                        and _key(record) not in explained and not _tf_logged_a_jpeg_failure(record)])
        finally:
            capture.close()
    return found
