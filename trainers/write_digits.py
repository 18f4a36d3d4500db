"""`python -m trainers.write_digits --png_dir=DIR [--split=test]`: the embedded digits as PNG files.

Real image files of the main job's task, for `python -m export --images` (TFLite verification and int8
calibration) and for trying a served model. A module of its own: run as `__main__`, the module that
defines the TFDS builder would register it under another package.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's INFO lines, as the trainer and exporter

from trainers import digits  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description="Write the digits of one split as PNG files.")
    parser.add_argument("--png_dir", required=True, help="Folder to write NNNN_LABEL.png files into.")
    parser.add_argument("--split", default="test", choices=("train", "test"))
    parser.add_argument("--data_dir", default=None, help="TFDS data directory (default ~/tensorflow_datasets).")
    args = parser.parse_args(argv)
    paths = digits.write_pngs(args.png_dir, args.split, args.data_dir)
    print(f"{len(paths)} PNG files written to {args.png_dir}")


if __name__ == "__main__":
    main()
