"""Class names shipped with an export: one per class, each a line of its labels file."""


def is_classifier(model):
    """Whether `model` ends in keras_vit's classification head (not `include_top=False`)."""
    return any(layer.name == "head" for layer in model.layers)


def check_labels(labels, model):
    """`labels` as strings, once they name `model`'s classes one to one; raises ValueError naming what is wrong."""
    if not is_classifier(model):
        raise ValueError("The model has no classification head (include_top=False): it exports features, "
                         "and labels have nothing to name; received labels")
    classes = int(model.output_shape[-1])
    labels = [str(label) for label in labels]
    if len(labels) != classes:
        raise ValueError(f"The model has {classes} classes; received {len(labels)} labels")
    for index, label in enumerate(labels):
        if "\n" in label or "\r" in label:  # it would shift every later label by a line
            raise ValueError(f"Each label must be one line of the labels file; label {index} holds a line "
                             f"break: {label!r}")
    return labels
