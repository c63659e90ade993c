"""`regroup.models.load`: the configured model's path."""

from __future__ import annotations

import pytest

from regroup.config.schema import ModelConfig
from regroup.models.load import configured_model_path


def test_configured_model_path_is_model_path_without_a_gguf_file(tmp_path):
    assert configured_model_path(ModelConfig(path=str(tmp_path))) == str(tmp_path)


def test_configured_model_path_refuses_the_built_in_model():
    """model.path=None is the built-in tiny model: there is no configured path to return."""
    with pytest.raises(ValueError, match="model.path is not set"):
        configured_model_path(ModelConfig())
