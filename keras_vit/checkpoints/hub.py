"""Hugging Face hub ids (`google/vit-base-patch16-224`): a local snapshot through `huggingface_hub`.

`huggingface_hub` is an optional extra (`pip install keras_vit[hub]`). It
answers from its cache first and offline (`HF_HUB_OFFLINE=1`) from the cache
alone; it downloads only the files a ViT directory needs (`FILES`). Without
it, or offline with an empty cache, the error names the files to download and
where to put them, and a directory holding them is read like any other.
"""

from keras_vit.checks import is_hub_id  # noqa: F401 (the form of an id: Keras-free, for command lines)

# What a transformers or timm ViT directory holds that keras_vit reads.
FILES = ("config.json", "preprocessor_config.json", "model.safetensors", "model.safetensors.index.json",
         "model-*.safetensors")


def snapshot(repo_id):
    """The local directory of `repo_id`'s files (from the cache, or downloaded into it).

    Raises:
        ValueError: without `huggingface_hub`, or when the files are neither
            cached nor downloadable, naming the files to fetch and where.
    """
    try:
        import huggingface_hub
        from huggingface_hub import errors
    except ImportError:
        raise ValueError(_manual(repo_id, "reading a hub id needs huggingface_hub (pip install keras_vit[hub])")) \
            from None
    try:
        return huggingface_hub.snapshot_download(repo_id, allow_patterns=list(FILES))
    except (errors.LocalEntryNotFoundError, errors.OfflineModeIsEnabled) as exc:
        from huggingface_hub import constants

        raise ValueError(_manual(repo_id, f"it is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and "
                                          f"cannot be downloaded ({type(exc).__name__})")) from None
    except errors.RepositoryNotFoundError:
        raise ValueError(f"{repo_id!r} is no Hugging Face hub repository keras_vit can read (not found, or "
                         "private: log in with `hf auth login`)") from None


def _manual(repo_id, why):
    """How to read `repo_id` without the hub client: the files, and the directory to pass."""
    local = repo_id.replace("/", "--")
    return (f"{repo_id!r} looks like a Hugging Face hub id, but {why}. Download config.json, model.safetensors "
            f"(or its shards with model.safetensors.index.json) and preprocessor_config.json from "
            f"https://huggingface.co/{repo_id}/tree/main into a directory, e.g. ./{local}/, and pass that directory")
