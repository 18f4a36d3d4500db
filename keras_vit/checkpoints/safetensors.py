"""The safetensors file format, read and written with numpy alone (no torch, no `safetensors` package).

The format (huggingface/safetensors): an 8-byte little-endian header length N,
N bytes of JSON `{name: {dtype, shape, data_offsets}, "__metadata__": {...}}`,
then the raw little-endian bytes, offsets relative to the end of the header.
"""

import json
import math
import os
import pathlib

import numpy as np

from keras_vit.atomic_files import atomic_file

# I64: index buffers some files keep beside the weights (an older CLIP's `position_ids`), read to be passed over.
_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8"}


def read_safetensors(path):
    """`{name: np.ndarray}` of a local `.safetensors` file.

    F32, F16 and F64 keep their dtype; BF16 becomes float32 (exactly: bf16 is
    the upper half of a float32). Other dtypes, and files whose header or
    data do not add up, raise a ValueError naming the file.
    """
    path = str(path)
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        header, start = _read_header(f, path, size)
        entries = {name: _entry(path, name, entry, start, size) for name, entry in header.items()
                   if name != "__metadata__"}
        _check_layout(path, entries, size - start)  # every check before any tensor's bytes are read
        return {name: _read_tensor(f, start, *entry) for name, entry in entries.items()}


def _check_layout(path, entries, data_size):
    """The format's rule: the tensors' byte ranges tile the data section, from 0 to its end, without overlap.

    A file that breaks it was written wrong or damaged: two tensors would read
    the same bytes, or bytes would belong to none.
    """
    position = 0
    for begin, end, name in sorted((begin, end, name) for name, (_, _, begin, end) in entries.items()):
        if begin != position:
            what = "overlaps the tensor before it" if begin < position else f"leaves bytes {position}-{begin} unused"
            raise ValueError(f"{path}: tensor {name!r} at data_offsets [{begin}, {end}) {what}; a safetensors "
                             "file's tensors cover its data section end to end")
        position = end
    if position != data_size:
        raise ValueError(f"{path}: its tensors end at byte {position} of a data section of {data_size} bytes; "
                         "a safetensors file's tensors cover its data section end to end")


def _read_header(f, path, size):
    """The JSON header and the offset its data starts at."""
    head = f.read(8)
    if len(head) < 8:
        raise ValueError(f"{path} is not a safetensors file: expected an 8-byte header length, found {len(head)} bytes")
    length = int.from_bytes(head, "little")
    if length > size - 8:
        raise ValueError(f"{path} is truncated or not a safetensors file: its header length is {length} bytes "
                         f"but only {size - 8} bytes follow")
    try:
        header = json.loads(f.read(length).decode("utf-8"), object_pairs_hook=lambda pairs: _unique(pairs, path))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} is not a safetensors file: expected a JSON header, found {exc}") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path} is not a safetensors file: expected a JSON object header, "
                         f"found {type(header).__name__}")
    return header, 8 + length


def _unique(pairs, path):
    """A JSON object's pairs as a dict; a name given twice (json keeps the last silently) is an error."""
    names = [name for name, _ in pairs]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"{path}: its header names {repeated} more than once")
    return dict(pairs)


def _entry(path, name, entry, start, size):
    """`(dtype, shape, begin, end)` of a header entry, checked: a known dtype, exactly the bytes its shape needs."""
    try:
        dtype, shape, (begin, end) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in (*shape, begin, end)):
            raise ValueError
    except (TypeError, KeyError, ValueError):
        raise ValueError(f"{path}: tensor {name!r} has a malformed header entry {entry!r}; expected "
                         "{dtype, shape, data_offsets: [begin, end]} of non-negative ints") from None
    if dtype not in _DTYPES:
        raise ValueError(f"{path}: tensor {name!r} has dtype {dtype}; keras_vit reads {sorted(_DTYPES)}")
    needed = math.prod(shape) * np.dtype(_DTYPES[dtype]).itemsize
    if end - begin != needed:
        raise ValueError(f"{path}: tensor {name!r} of shape {shape} and dtype {dtype} needs {needed} bytes; "
                         f"its data_offsets [{begin}, {end}) hold {end - begin}")
    if start + end > size:
        raise ValueError(f"{path} is truncated: tensor {name!r} needs bytes up to {start + end}, "
                         f"found a file of {size} bytes")
    return dtype, shape, begin, end


def _read_tensor(f, start, dtype, shape, begin, end):
    f.seek(start + begin)
    data = bytearray(end - begin)
    f.readinto(data)
    array = np.frombuffer(data, dtype=_DTYPES[dtype]).reshape(shape)
    if dtype == "BF16":
        array = (array.astype(np.uint32) << 16).view(np.float32)
    return array


def write_safetensors(path, tensors, metadata=None):
    """Writes `{name: np.ndarray}` (float32, float16 or float64) as a `.safetensors` file, atomically.

    Tensors are laid out in name order, as the `safetensors` package writes
    them; `metadata` is a dict of strings (transformers reads `{"format": "pt"}`).
    """
    dtypes = {np.dtype(numpy_dtype): name for name, numpy_dtype in _DTYPES.items() if name != "BF16"}
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        array = np.asarray(tensors[name])
        if array.dtype not in dtypes:
            raise ValueError(f"{path}: tensor {name!r} has dtype {array.dtype}; expected one of "
                             f"{sorted(str(d) for d in dtypes)}")
        blob = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": dtypes[array.dtype], "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data section starts 8-byte aligned, as the format's writer pads it
    with atomic_file(pathlib.Path(path)) as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for blob in blobs:
            f.write(blob)
    return str(path)
