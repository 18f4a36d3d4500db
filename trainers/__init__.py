"""The keras_vit trainer: `python -m trainers.train --recipe=NAME --model_dir=DIR`."""
