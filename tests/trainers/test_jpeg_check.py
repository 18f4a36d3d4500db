"""A JPEG cut short and closed again with its end marker decodes, partly grey, with only an anonymous warning:
`trainers.jpeg_check` names it, in pytest's captured process and in a plain one alike."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from trainers import jpeg_check

ROOT = pathlib.Path(__file__).parents[2]
WARNING = "Corrupt JPEG data: premature end of data segment"
GREY = "corrupt JPEG data (libjpeg: premature end of data segment): decodes partly grey"


def _jpeg(seed=0, size=320, progressive=False):
    """Smooth colour and noise: some tens of kilobytes of scan data, so half of the file is half of the image."""
    y, x = np.mgrid[0:size, 0:size]
    smooth = np.stack([np.sin(x / 17 + seed), np.cos(y / 23), np.sin((x + y) / 31)], -1) * 80 + 128
    noisy = smooth + np.random.default_rng(seed).normal(0, 12, smooth.shape)
    return tf.io.encode_jpeg(np.clip(noisy, 0, 255).astype(np.uint8), quality=90, progressive=progressive).numpy()


def _closed_early(encoded):
    """The first half of the file and the end-of-image marker: whole by its ends, half of its scan data lost."""
    return encoded[: len(encoded) // 2] + b"\xff\xd9"


def _folder(root):
    """{name: path} of good files (more than one chunk of them), a cut-and-closed JPEG among them, and others."""
    good = _jpeg(size=48)
    files = {f"good{i:02d}.jpg": good for i in range(jpeg_check.CHUNK + 6)}
    files.update({
        "whole.jpg": _jpeg(1),
        "closed_early.jpg": _closed_early(_jpeg(2)),
        "closed_early_named.png": _closed_early(_jpeg(3)),  # a JPEG by its bytes, whatever its name
        "closed_early_progressive.jpg": _closed_early(_jpeg(4, progressive=True)),
        "cut.jpg": _jpeg(5)[:3000],  # no end marker: the decoder fails outright
        "picture.png": tf.io.encode_png(np.zeros((16, 16, 3), np.uint8)).numpy(),
        "trailer.jpg": _jpeg(6) + b"camera maker's data",  # bytes after the end marker: decodes whole
    })
    names = sorted(files)  # the bad ones fall in the second chunk
    names.insert(jpeg_check.CHUNK + 2, names.pop(names.index("closed_early.jpg")))
    paths = {}
    for name in names:
        paths[name] = root / name
        paths[name].write_bytes(files[name])
    return paths


EXPECTED = {"closed_early.jpg": GREY, "closed_early_named.png": GREY, "closed_early_progressive.jpg": GREY}


def test_a_jpeg_closed_early_decodes_without_error_the_premise(capfd):
    encoded = _jpeg()
    closed = _closed_early(encoded)
    assert closed.endswith(b"\xff\xd9") and len(closed) > 10_000
    for ratio in (1, 8):  # the check decodes at ratio=8: libjpeg still reads all the scan data there
        capfd.readouterr()
        assert tf.io.decode_jpeg(closed, ratio=ratio).shape == (320 // ratio, 320 // ratio, 3)
        assert WARNING in capfd.readouterr().err  # the anonymous line on fd 2 is all that is said
    assert b"\xff\xc2" in _jpeg(progressive=True)[:1000]  # a progressive frame (SOF2): that case is tested below


def test_names_the_jpegs_closed_early_and_the_cut_one_not_the_whole_ones_or_a_png(tmp_path, capfd):
    paths = _folder(tmp_path)
    capfd.readouterr()
    found = jpeg_check.corrupt_jpegs([str(path) for path in paths.values()])
    by_name = {pathlib.Path(path).name: reason for path, reason in found.items()}
    assert set(by_name) == {*EXPECTED, "cut.jpg"}, by_name
    assert {name: by_name[name] for name in EXPECTED} == EXPECTED
    assert by_name["cut.jpg"].startswith("cannot be decoded, cut short or corrupt (")
    os.write(2, b"after the check\n")  # fd 2 is pytest's capture again
    err = capfd.readouterr().err
    assert "after the check" in err
    assert "Corrupt JPEG data" not in err  # the anonymous warnings became the named reasons above


def test_names_them_in_a_plain_process_where_stderr_is_a_pipe(tmp_path):
    paths = _folder(tmp_path)
    code = ("import json, sys; from trainers import jpeg_check; "
            "print(json.dumps(jpeg_check.corrupt_jpegs(sys.argv[1:])))")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run([sys.executable, "-c", code, *map(str, paths.values())], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    found = {pathlib.Path(path).name: reason for path, reason in json.loads(result.stdout).items()}
    assert set(found) == {*EXPECTED, "cut.jpg"} and all(found[name] == EXPECTED[name] for name in EXPECTED)
    assert "Corrupt JPEG data" not in result.stderr


def test_stderr_is_restored_when_the_decode_raises(tmp_path):
    before = os.fstat(2)
    capture = tmp_path / "capture"
    with open(capture, "wb") as file, pytest.raises(RuntimeError):
        with jpeg_check._stderr_into(file.fileno()):
            os.write(2, b"captured\n")
            raise RuntimeError("a decode that raises")
    after = os.fstat(2)
    assert (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino)
    assert capture.read_bytes() == b"captured\n"


def test_other_output_during_the_check_is_written_back(tmp_path, capfd, monkeypatch):
    decoded_count = jpeg_check._decoded_count

    def and_another_thread_speaks(paths):
        os.write(2, b"a line of someone else's\n")
        return decoded_count(paths)

    monkeypatch.setattr(jpeg_check, "_decoded_count", and_another_thread_speaks)
    path = tmp_path / "closed_early.jpg"
    path.write_bytes(_closed_early(_jpeg()))
    capfd.readouterr()
    assert jpeg_check.corrupt_jpegs([str(path)]) == {str(path): GREY}  # its chunk was decoded again, file by file
    err = capfd.readouterr().err
    assert err.count("a line of someone else's") == 1 and "Corrupt JPEG data" not in err


def test_warnings_that_leave_every_pixel_the_file_s_are_not_reasons():
    assert jpeg_check.lost_pixels(WARNING) == GREY
    assert jpeg_check.lost_pixels("Premature end of JPEG file\n").startswith("corrupt JPEG data (libjpeg: premature")
    assert jpeg_check.lost_pixels("Corrupt JPEG data: bad Huffman code").endswith("decodes partly garbled")
    for harmless in ("Corrupt JPEG data: 2 extraneous bytes before marker 0xd9", "Corrupt JPEG data: bad ICC marker"):
        assert jpeg_check.lost_pixels(harmless) is None
