"""A folder of images as a dataset: `ROOT/SPLIT/LABEL/IMAGE`, read without TensorFlow.

Everything a run decides about a folder is decided here from file names
alone, before TensorFlow starts: its layout (and what is wrong with it), its
classes (the label folders of every split, sorted, so that each split numbers
them alike), split slices (`train[:80%]`) and the validation hold-out. Both
take a share of every class, in an order keyed by each file's name, so a
resumed run reads the same parts and the parts never share a file.
"""

import dataclasses
import os
import re
import zlib

EXTENSIONS = (".jpg", ".jpeg", ".png")

# Names under which users keep their test images, in the order a run looks for one.
TEST_SPLITS = ("test", "val", "validation")
# Folder names that say "split", not "class".
SPLIT_WORDS = ("train", "training", *TEST_SPLITS)
_SLICE = re.compile(r"^(?P<split>[^\[\]]+)(\[(?P<start>[^:\]]*):(?P<stop>[^\]]*)\])?$")


def layout(root, split="SPLIT"):
    return f"{root}/{split}/LABEL/IMAGE (.jpg, .jpeg or .png), one LABEL folder per class"


def _subfolders(path):
    return sorted(name for name in os.listdir(path) if not name.startswith(".")
                  and os.path.isdir(os.path.join(path, name)))


def _images_in(path):
    return sorted(name for name in os.listdir(path) if name.lower().endswith(EXTENSIONS)
                  and os.path.isfile(os.path.join(path, name)))


def splits(root):
    """The split folders of `root`: those holding at least one label folder with an image."""
    return [name for name in _subfolders(root)
            if any(_images_in(os.path.join(root, name, label)) for label in _subfolders(os.path.join(root, name)))]


def layout_problem(root):
    """Why `root` is not a folder dataset, naming the layout expected and what was found; None if it is one."""
    if not os.path.isdir(root):
        return f"dataset='folder:{root}': no such directory (expected {layout(root)})"
    if splits(root):
        return None
    expected = f"dataset='folder:{root}' holds no images where they are expected: expected {layout(root)}"
    holding = [name for name in _subfolders(root) if _images_in(os.path.join(root, name))]
    split_like = [name for name in holding if name.lower() in SPLIT_WORDS]
    if split_like:  # ROOT/SPLIT/IMAGE: the class level is missing
        where = os.path.join(root, split_like[0])
        return (f"{expected}; found {len(_images_in(where))} images directly in {where}, in no LABEL folder: put "
                f"each class's images in its own folder, {where}/LABEL/")
    if holding:  # ROOT/LABEL/IMAGE: the split level is missing, or ROOT is a split itself
        named = ", ".join(holding[:5]) + (f" and {len(holding) - 5} more" if len(holding) > 5 else "")
        if os.path.basename(os.path.normpath(root)).lower() in SPLIT_WORDS:
            return (f"{expected}; its folders {named} hold images: it is a split, one level too deep. Pass its "
                    f"parent: --dataset=folder:{os.path.dirname(os.path.normpath(root))}")
        return (f"{expected}; its folders {named} hold images directly: they are classes without a split folder. "
                f"Move them into {root}/train/ (then {root}/train/{holding[0]}/IMAGE)")
    loose = _images_in(root)
    if loose:
        return f"{expected}; found {len(loose)} images directly in {root}, in no class folder"
    empty = [f"{split}/{label}" for split in _subfolders(root) for label in _subfolders(os.path.join(root, split))]
    if empty:
        return f"{expected}; found label folders {empty[:5]} without images"
    return f"{expected}; found {'folders ' + ', '.join(_subfolders(root)[:5]) if _subfolders(root) else 'nothing'}"


def parse_split(expression):
    """`(split, (start, stop))` of 'train', 'train[:80%]' or 'train[10%:90%]' (percentages, None where open).

    Raises ValueError naming what folders accept.
    """
    match = _SLICE.match(expression.strip())
    bounds = []
    for bound in (match.group("start"), match.group("stop")) if match and match.group(2) else ():
        bound = bound.strip()
        number = re.fullmatch(r"(\d+(?:\.\d+)?)%", bound)
        if bound and not (number and float(number.group(1)) <= 100):
            match = None
            break
        bounds.append(float(number.group(1)) if bound else None)
    if not match:
        raise ValueError(f"A folder's split is a folder name or a slice of it in percent, such as 'train[:80%]' or "
                         f"'train[80%:]' (each class sliced alike); received {expression!r}")
    return match.group("split"), tuple(bounds) if bounds else None


def _name_key(relative, salt=""):
    """The order files are sliced and held out in: a hash of the name, then the name (no ties)."""
    return zlib.crc32(f"{salt}{relative}".encode()), relative


@dataclasses.dataclass(frozen=True)
class Files:
    """Images of one split: `paths[i]` has class `labels[i]` of `classes`; `ranges` says which part of each class."""

    root: str
    split: str
    classes: tuple
    paths: tuple
    labels: tuple
    # (class folder, first, end) in the class's name order: what tells two slices that share files.
    ranges: tuple = ()

    def __len__(self):
        return len(self.paths)

    def counts(self):
        """Images per class, every class listed."""
        counts = dict.fromkeys(self.classes, 0)
        for label in self.labels:
            counts[self.classes[label]] += 1
        return counts

    def keep(self, keep):
        """The files for which `keep(path)` holds, ranges dropped (a part is no longer a slice)."""
        chosen = [(path, label) for path, label in zip(self.paths, self.labels, strict=True) if keep(path)]
        return dataclasses.replace(self, paths=tuple(p for p, _ in chosen), labels=tuple(label for _, label in chosen),
                                   ranges=())


def classes(root):
    """The class names of a folder dataset: the label folders of all its splits, sorted."""
    return tuple(sorted({label for split in splits(root) for label in _subfolders(os.path.join(root, split))
                         if _images_in(os.path.join(root, split, label))}))


def list_split(root, expression):
    """The `Files` of split `expression` ('train', 'train[:80%]') of the folder dataset at `root`.

    A slice takes the same share of every class, in each class's name order; percentages round to the
    nearest file, so 'train[:80%]' and 'train[80%:]' split every class between them.
    Raises ValueError naming the layout, the splits there are or the slice accepted.
    """
    split, bounds = parse_split(expression)
    available = splits(root)
    if split not in available:
        hint = (f"; with only {available}, pass --eval_split='' to report the validation split held out of "
                f"training, or slice one off: --train_split='{available[0]}[:80%]' --eval_split="
                f"'{available[0]}[80%:]'" if available else "")
        raise ValueError(f"split {split!r} is not one of the splits of dataset 'folder:{root}': {available} "
                         f"(folders holding {layout(root, 'SPLIT')}){hint}")
    names = classes(root)
    paths, labels, ranges = [], [], []
    for label, name in enumerate(names):
        folder = os.path.join(root, split, name)
        files = _images_in(folder) if os.path.isdir(folder) else []
        files.sort(key=lambda file: _name_key(f"{name}/{file}"))
        first, end = 0, len(files)
        if bounds:
            first, end = (round(len(files) * bound / 100) if bound is not None else default
                          for bound, default in zip(bounds, (0, len(files)), strict=True))
        paths.extend(os.path.join(folder, file) for file in files[first:end])
        labels.extend([label] * len(files[first:end]))
        ranges.append((os.path.realpath(folder), first, end if bounds else float("inf")))
    return Files(root, expression, names, tuple(paths), tuple(labels), tuple(ranges))


def hold_out(files, fraction, seed):
    """`(train, validation)` of `files`: of each class of two or more images, round(fraction * n), at least one.

    Chosen in the class's order of hash(seed, name), so a resumed run, or one on another machine, holds out
    the same images, and the two parts never share one.
    """
    held = set()
    by_class = {}
    for path, label in zip(files.paths, files.labels, strict=True):
        by_class.setdefault(label, []).append(path)
    for label, paths in by_class.items():
        if len(paths) < 2:
            continue
        count = min(len(paths) - 1, max(1, round(fraction * len(paths))))
        key = lambda path: _name_key(f"{files.classes[label]}/{os.path.basename(path)}", f"{seed}/")  # noqa: B023,E731
        held.update(sorted(paths, key=key)[:count])
    return files.keep(lambda path: path not in held), files.keep(lambda path: path in held)
