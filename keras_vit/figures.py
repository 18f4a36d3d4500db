"""The figures of `python -m keras_vit.explain`, drawn with matplotlib from `keras_vit.analysis`.

Each figure is written under a temporary name and renamed, so a crash never
leaves a half-written PNG under its final name.
"""

import os
import pathlib

import numpy as np

from keras_vit import analysis

DPI = 120


def _pyplot():
    """matplotlib's pyplot on the file-only Agg backend (no display needed), imported on use."""
    try:
        import matplotlib
    except ImportError as error:
        raise ImportError("The figures need matplotlib: pip install 'keras-vision-transformer[viz]' (in a checkout: "
                          "pip install -e '.[viz]')") from error
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(figure, path):
    plt = _pyplot()
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}.png")
    figure.savefig(tmp, dpi=DPI, bbox_inches="tight")
    plt.close(figure)
    os.replace(tmp, path)
    return path


def rollout_figure(pixels, rollout, predictions, head_fusion):
    """The image, its rollout overlaid with a colour bar, and the top classes as bars."""
    plt = _pyplot()
    panels = 3 if predictions else 2
    figure, axes = plt.subplots(1, panels, figsize=(4.2 * panels, 4.2))
    shown = pixels[..., 0] if pixels.shape[-1] == 1 else pixels
    axes[0].imshow(shown, cmap="gray" if pixels.shape[-1] == 1 else None)
    axes[0].set_title("Input (as the model sees it)")
    axes[1].imshow(shown, cmap="gray" if pixels.shape[-1] == 1 else None)
    overlay = axes[1].imshow(rollout, cmap="inferno", alpha=0.6, vmin=0, vmax=1)
    axes[1].set_title(f"Attention rollout ({head_fusion} over heads)")
    figure.colorbar(overlay, ax=axes[1], fraction=0.046, pad=0.04, label="relative attention")
    for ax in axes[:2]:
        ax.set_xticks([])
        ax.set_yticks([])
    if predictions:
        names, probabilities = zip(*predictions[::-1], strict=True)
        axes[2].barh(range(len(names)), probabilities, color="tab:blue")
        axes[2].set_yticks(range(len(names)), names)
        axes[2].set_xlim(0, 1)
        axes[2].set_xlabel("probability")
        axes[2].set_title("Top classes")
    figure.tight_layout()
    return figure


def distance_figure(distances, image_size):
    """Mean attention distance per head (dots) against depth, the paper's Figure 7 (right)."""
    plt = _pyplot()
    figure, ax = plt.subplots(figsize=(6, 4.2))
    blocks, heads = distances.shape
    for head in range(heads):
        ax.scatter(np.arange(1, blocks + 1), distances[:, head], s=18,
                   label=f"head {head + 1}" if heads <= 16 else None)
    ax.set_xlabel("network depth (encoder block)")
    ax.set_ylabel("mean attention distance (pixels)")
    ax.set_ylim(0, max(image_size) * 1.05)
    ax.set_xticks(range(1, blocks + 1))
    ax.set_title(f"Mean attention distance of each head ({image_size[0]}x{image_size[1]} px image)")
    if heads <= 16:
        ax.legend(fontsize="small", ncols=2, loc="lower right")
    ax.grid(alpha=0.3)
    return figure


def similarity_figure(similarity):
    """A grid of grids: each patch's position-embedding similarity map, the paper's Figure 7 (centre)."""
    plt = _pyplot()
    rows, cols = similarity.shape[:2]
    figure, axes = plt.subplots(rows, cols, figsize=(min(1.0 * cols, 14) + 1, min(1.0 * rows, 14)),
                                squeeze=False)
    for i in range(rows):
        for j in range(cols):
            image = axes[i, j].imshow(similarity[i, j], cmap="viridis", vmin=-1, vmax=1)
            axes[i, j].set_xticks([])
            axes[i, j].set_yticks([])
        axes[i, 0].set_ylabel(str(i + 1), rotation=0, labelpad=8)
    for j in range(cols):
        axes[-1, j].set_xlabel(str(j + 1))
    figure.supylabel("input patch row")
    figure.supxlabel("input patch column")
    figure.suptitle("Position embedding similarity (cosine)")
    figure.colorbar(image, ax=axes, fraction=0.03, pad=0.02, label="cosine similarity")
    return figure


def filters_figure(components, ratios):
    """The principal components of the patch-embedding filters, each scaled to show its pattern."""
    plt = _pyplot()
    count = len(components)
    cols = min(7, count)
    rows = -(-count // cols)
    figure, axes = plt.subplots(rows, cols, figsize=(1.6 * cols, 1.8 * rows + 0.6), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for k, (component, ratio) in enumerate(zip(components, ratios, strict=True)):
        low, high = component.min(), component.max()
        shown = (component - low) / (high - low) if high > low else np.zeros_like(component)
        ax = axes.flat[k]
        ax.imshow(shown[..., 0] if shown.shape[-1] == 1 else shown[..., :3], cmap="gray", interpolation="nearest")
        ax.set_title(f"PC {k + 1}: {100 * ratio:.1f}%", fontsize="small")
    figure.suptitle("Principal components of the patch-embedding filters (share of variance)")
    figure.tight_layout()
    return figure


def write_all(model, pixels, inputs, predictions, output, head_fusion="mean"):
    """Writes every figure the model allows into `output`; returns `[(path, what it shows)]`."""
    output = pathlib.Path(output)
    output.mkdir(parents=True, exist_ok=True)
    config = model.vit_config
    maps = analysis.attention_maps(model, inputs)
    rollout = analysis.rollout_map(model, inputs, head_fusion=head_fusion)[0]
    distances = analysis.mean_attention_distance(maps, config.grid_size, config.token_size,
                                                 config.num_prefix_tokens)
    written = [
        (_save(rollout_figure(pixels, rollout, predictions, head_fusion), output / "rollout.png"),
         "the image, its attention rollout" + (" and the top classes" if predictions else "")),
        (_save(distance_figure(distances, config.image_size), output / "attention_distance.png"),
         "mean attention distance of every head of every block"),
    ]
    if config.position_embedding in ("learned_1d", "learned_2d"):
        similarity = analysis.position_embedding_similarity(model)
        written.append((_save(similarity_figure(similarity), output / "position_similarity.png"),
                        "position-embedding similarity of every patch with every other"))
    else:
        written.append(("(no position_similarity.png)",
                        f"position_embedding={config.position_embedding!r} has no learned table to compare"))
    if config.resnet_num_layers is not None:
        written.append(("(no embedding_filters.png)", "a hybrid's patch filters see ResNet features, not pixels"))
        return written
    kernel_size = int(np.prod(model.get_layer("patch_embedding").kernel.shape[:3]))
    components, ratios = analysis.embedding_filter_components(model, count=min(28, config.hidden_size, kernel_size))
    written.append((_save(filters_figure(components, ratios), output / "embedding_filters.png"),
                    "principal components of the patch-embedding filters"))
    return written
