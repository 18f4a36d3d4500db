import pytest

from keras_vit.config import ViTConfig
from keras_vit.variants import decode_variant, variant_name


def test_table_1_of_the_paper():
    assert decode_variant("B/16") == ViTConfig(patch_size=16, hidden_size=768, mlp_dim=3072, num_heads=12,
                                               num_layers=12)
    assert decode_variant("L/32") == ViTConfig(patch_size=32, hidden_size=1024, mlp_dim=4096, num_heads=16,
                                               num_layers=24)
    assert decode_variant("H/14") == ViTConfig(patch_size=14, hidden_size=1280, mlp_dim=5120, num_heads=16,
                                               num_layers=32)
    assert decode_variant("Ti/16").hidden_size == 192 and decode_variant("S/32").num_heads == 6


@pytest.mark.parametrize("name",
                         ["Ti/16", "S/32", "B/8", "L/16", "H/14", "R+Ti/16", "R26+S/32", "R50+B/16", "R50+L/32"])
def test_a_variant_is_named_back_from_its_config(name):
    assert variant_name(decode_variant(name)) == name
    assert variant_name(decode_variant(name).replace(num_layers=3)) is None


@pytest.mark.parametrize("name", ["X/16", "B16", "B/", "", None])
def test_unknown_variant_names_the_accepted_form(name):
    with pytest.raises(ValueError, match=f"received variant={name!r}"):
        decode_variant(name)


def test_every_named_variant_has_its_builder():
    import keras_vit
    from keras_vit.variants import VARIANTS

    for name, config in VARIANTS.items():
        stem, _, body = name.rpartition("+")
        builder = getattr(keras_vit, f"{stem}_ViT_{body.replace('/', '')}".lstrip("_"))
        assert builder.__doc__.startswith(f"Builds {name.replace('+', '+ViT-') if stem else 'ViT-' + name}")
        assert config == decode_variant(name)
