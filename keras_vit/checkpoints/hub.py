"""Hugging Face hub ids (`google/vit-base-patch16-224`): a local snapshot through `huggingface_hub`.

`huggingface_hub` is an optional extra (`pip install 'keras-vision-transformer[hub]'`;
in a checkout `pip install -e '.[hub]'`). It answers from its cache first and
offline (`HF_HUB_OFFLINE=1`) from the cache alone; it downloads only the
files a ViT directory needs (`FILES`). Offline with an empty cache, a
`WeightsUnavailable` says how to fill the cache (`hf download`) or pass a
folder; without the library, the error names the files to download and where
to put them, and a directory holding them is read like any other. An id that
the hub does not know may have been meant as a folder: that error says first
that no such folder exists.
"""

from keras_vit.checkpoints.pretrained import WeightsUnavailable, one_line
from keras_vit.checks import is_hub_id  # noqa: F401 (the form of an id: Keras-free, for command lines)

INSTALL = "pip install 'keras-vision-transformer[hub]' (in a checkout: pip install -e '.[hub]')"
# What a transformers or timm ViT directory holds that keras_vit reads.
FILES = ("config.json", "preprocessor_config.json", "model.safetensors", "model.safetensors.index.json",
         "model-*.safetensors")


def snapshot(repo_id):
    """The local directory of `repo_id`'s files (from the cache, or downloaded into it).

    Raises:
        WeightsUnavailable: when the files are neither cached nor downloadable.
        ValueError: without `huggingface_hub`, naming the files to fetch and
            where; for an id the hub does not know, saying first that no
            local path of that name exists.
    """
    try:
        import huggingface_hub
        from huggingface_hub import constants, errors
    except ImportError:
        raise ValueError(_manual(repo_id, f"reading a hub id needs huggingface_hub ({INSTALL})")) from None
    try:
        return huggingface_hub.snapshot_download(repo_id, allow_patterns=list(FILES))
    except (errors.LocalEntryNotFoundError, errors.OfflineModeIsEnabled) as exc:
        offline = errors.OfflineModeIsEnabled in (type(exc), type(exc.__cause__))
        reason = "HF_HUB_OFFLINE is set" if offline else one_line(exc)
        org, name = repo_id.split("/")
        # A plain `org/name` may have been meant as a folder: say that none of that name exists either.
        raise WeightsUnavailable(
            f"the Hugging Face hub id {repo_id!r}", f"{constants.ENDPOINT}/{repo_id}",
            f"{reason}; it is not in the Hugging Face cache, and no local file or folder has that name",
            f"copy the folder models--{org}--{name} that `hf download {repo_id}` fills into {constants.HF_HUB_CACHE}",
            f"the folder `hf download {repo_id} --local-dir PATH` fills") from None
    except errors.RepositoryNotFoundError:
        raise ValueError(f"no such file or directory: {repo_id!r}, nor a Hugging Face hub repository keras_vit can "
                         "read (not found, or private: log in with `hf auth login`)") from None


def _manual(repo_id, why):
    """How to read `repo_id` without the hub client: the files, and the directory to pass."""
    local = repo_id.replace("/", "--")
    return (f"{repo_id!r} looks like a Hugging Face hub id, but {why}. Download config.json, model.safetensors "
            f"(or its shards with model.safetensors.index.json) and preprocessor_config.json from "
            f"https://huggingface.co/{repo_id}/tree/main into a directory, e.g. ./{local}/, and pass that directory")
