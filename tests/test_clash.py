import importlib.metadata

import pytest

from keras_vit import _clash


def test_no_warning_without_the_clashing_package(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    assert _clash.warn_if_shadowed() is False


def test_warns_with_the_fix_when_keras_vit_is_installed(monkeypatch):
    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: object())
    with pytest.warns(UserWarning, match="pip uninstall -y keras-vit keras-vision-transformer"):
        assert _clash.warn_if_shadowed() is True
