"""The fenced code blocks of README.md and docs/*.md, and how the suite runs them as a user would.

A block runs unless the line above its fence is a marker saying why it cannot run here and which test
stands in for it:

    <!-- not run here: needs a TF Serving server; stands in: tests/test_docs.py::test_rest_requests -->

Shell blocks run command by command in one working folder, in document order, after one substitution
table (`SHELL`) has shortened what would take hours; Python blocks run in a fresh process each, with
stand-ins for the names a reader supplies (`PYTHON_GIVEN`).
"""

import dataclasses
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
MARKER = re.compile(r"<!--\s*not run here:\s*(?P<why>.+?);\s*stands in:\s*(?P<test>\S+)\s*-->")
FENCE = re.compile(r"^```(?P<lang>\w*)\s*$")


@dataclasses.dataclass(frozen=True)
class Block:
    path: pathlib.Path
    line: int  # of the opening fence, from 1
    lang: str
    text: str
    marker: re.Match = None  # the not-run marker above the fence, if any

    @property
    def where(self):
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path):
    """Every fenced block of one Markdown file, in order."""
    lines = path.read_text().splitlines()
    found, start = [], None
    for number, line in enumerate(lines):
        fence = FENCE.match(line)
        if not fence:
            continue
        if start is None:
            start, lang = number, fence.group("lang")
            continue
        above = lines[start - 1] if start else ""
        found.append(Block(path, start + 1, lang, "\n".join(lines[start + 1:number]) + "\n", MARKER.search(above)))
        start = None
    if start is not None:
        raise ValueError(f"{path}:{start + 1}: a fence that is never closed")
    return found


def commands(text):
    """The commands of a shell block: comment lines dropped, `\\`-continued lines and quoted line breaks joined."""
    joined, current = [], ""
    for line in text.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line[:-1] + " " if line.endswith("\\") else line
        if line.endswith("\\") or current.count('"') % 2:  # a continued line, or a quoted string spanning lines
            current += "" if line.endswith("\\") else "\n"
            continue
        joined.append(current.strip())
        current = ""
    return joined


# (pattern, replacement): applied in order to every shell command. A replacement of None leaves the command
# out, with the reason in the third field: the suite's own install and run are what CI executes around it.
SHELL = (
    (r"^python3 -m venv \.venv && \.venv/bin/pip install -q -e '\.\[[a-z,]+\]' && \.venv/bin/python -m pytest.*$",
     None, "the suite itself: CI runs exactly this command"),
    (r"^python3 -m venv \.venv && \.venv/bin/pip install -q -e '\.\[[a-z,]+\]' && \.venv/bin/", "",
     "the install: the suite runs in the environment the README's test command installed"),
    (r"^(\.venv/bin/)?pip install (-q )?-e '\.\[[a-z,]+\]'", None,
     "an extra's install: the suite's environment has every extra"),
    (r"^\.venv/bin/python ", "python ", "the checkout's venv: the suite runs in it, from the reader's folder"),
    # The fine-tuning example's few hundred steps of ViT-Ti/16 at 224 px, cut to two at 32 px (the checkpoint's
    # positions resized on load): the same code and files, in seconds.
    (r"(-m trainers\.train --dataset=folder:my_images .*) --train_steps=300$",
     r"\1 --train_steps=2 --steps_per_execution=1 --image_size=32", None),
    (r"/srv/models", "serving", "the guide's TF Serving folder: the README's, inside the suite's working folder, where "
     "the README's digits export stands for the guide's (tests/test_docs.py)"),
    # The main job's full run is the README's own figure (benchmarks); a short run writes the same files.
    (r"(-m trainers\.train --model_dir=runs/digits)$", r"\1 --train_steps=60 --checkpoint_every=30", None),
)


def substituted(command):
    """`command` after the `SHELL` table; None when the table leaves it out."""
    for pattern, replacement, _ in SHELL:
        if re.search(pattern, command):
            if replacement is None:
                return None
            command = re.sub(pattern, replacement, command)
    return command
