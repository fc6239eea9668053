"""The torch-free side of train and export for any model: the recipe's `model:` fields checked
against the arch, each arch's declared inputs, the data's image settings (old and new fields),
the task's kind, and the features bound to a model's inputs by name."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from zoo.errors import InvalidInput
from zoo_stages.lib.models import archs
from zoo_stages.lib.quality import tasks
from zoo_stages.lib.runtimes import onnx_run
from zoo_stages.sections.model import ModelSpec

BERT = {"arch": "bert", "hidden_size": 128, "num_layers": 2, "num_heads": 2, "intermediate_size": 512,
        "max_length": 32}


@pytest.mark.parametrize("model, message", [
    ({"arch": "lenet5", "hidden": [8]}, "`hidden` applies to arch mlp only, not to arch: lenet5"),
    ({"arch": "mlp", "hidden_size": 64}, "`hidden_size` applies to arch bert only"),
    ({"entry": "net.py:make", "dropout": 0.1}, "not to a model without `arch`"),
    ({"arch": "bert", "hidden_size": 128}, "arch: bert needs num_layers, num_heads, intermediate_size, max_length"),
    ({**BERT, "num_heads": 3}, "hidden_size 128 is not a multiple of num_heads 3"),
    ({"arch": "mlp", "hidden": []}, "at least 1 item"),
    ({"arch": "mlp", "hidden": [8, 0]}, "widths must be at least 1"),
    ({"arch": "mlp", "dropout": 1.0}, "less than 1"),
    ({**BERT, "vocab_size": 1}, "greater than or equal to 2"),
])
def test_model_fields_are_checked_against_the_arch(model, message):
    with pytest.raises(ValidationError, match=message):
        ModelSpec.model_validate(model)


def test_model_fields_that_fit_their_arch_validate():
    assert ModelSpec.model_validate({"arch": "mlp"}).hidden is None  # the arch's default [64, 32]
    assert ModelSpec.model_validate({"arch": "mlp", "hidden": [16], "dropout": 0.2}).dropout == 0.2
    assert ModelSpec.model_validate({**BERT, "vocab_size": 8000, "dropout": 0.0}).vocab_size == 8000
    assert ModelSpec.model_validate({"arch": "alexnet", "dropout": 0.3}).dropout == 0.3


def test_each_arch_declares_its_inputs():
    assert archs.model_inputs({"arch": "lenet5"}) == [archs.ModelInput("input", "image")]
    assert archs.model_inputs({"arch": "lenet5", "input_name": "pixels"})[0].name == "pixels"
    assert archs.model_inputs({"entry": "net.py:make"}) == [archs.ModelInput("input", "image")]
    assert archs.model_inputs({"arch": "mlp"}) == [archs.ModelInput("features", "table")]
    assert archs.model_inputs(BERT) == [archs.ModelInput("input_ids", "token_ids", "int64"),
                                        archs.ModelInput("attention_mask", "mask", "int64")]


def test_declared_model_inputs_rename_the_arch_inputs_in_order():
    declared = {"ids": {"shape": ["batch", "sequence"], "dtype": "int32"},
                "mask": {"shape": ["batch", "sequence"], "dtype": "int64"}}
    assert archs.model_inputs({**BERT, "inputs": declared}) == [archs.ModelInput("ids", "token_ids", "int32"),
                                                               archs.ModelInput("mask", "mask", "int64")]
    with pytest.raises(InvalidInput, match="model.inputs.ids is float32") as err:
        archs.model_inputs({**BERT, "inputs": {**declared, "ids": {"shape": ["batch", "sequence"], "dtype": "float32"}}})
    assert err.value.hint == "set `model.inputs.ids.dtype: int64`"
    with pytest.raises(InvalidInput, match="declares 1 input.*takes 2"):
        archs.model_inputs({**BERT, "inputs": {"ids": declared["ids"]}})
    # a user model may take several inputs: the declaration is trusted
    user = archs.model_inputs({"entry": "net.py:make", "inputs": declared})
    assert [(i.name, i.holds, i.dtype) for i in user] == [("ids", "any", "int32"), ("mask", "any", "int64")]


def test_image_settings_read_the_new_and_the_old_data_fields():
    assert archs.image_settings({"image_size": 16, "channels": 3}) == (3, (16, 16), "NCHW")
    assert archs.image_settings({"image": {"size": [8, 6], "channels": 1}}) == (1, (8, 6), "NCHW")
    assert archs.image_settings({"image": {"size": [8, 6], "layout": "nhwc"}, "channels": 3}) == (3, (8, 6), "NHWC")
    assert archs.image_settings({"image": {"layout": "NHWC"}, "image_size": 4}) == (1, (4, 4), "NHWC")
    assert archs.image_settings(None) == (1, (8, 8), "NCHW")


@pytest.mark.parametrize("task, kind", [
    ("classification", "classification"), ("image-classification", "classification"),
    ("text-classification", "classification"), ("tabular-regression", "regression"), ("regression", "regression"),
    ("generic", "generic"), ("object-detection", "generic"), ("feature-extraction", "generic"), ("", "generic"),
])
def test_the_task_names_the_kind_of_model(task, kind):
    assert tasks.kind_of(task) == kind


def test_features_bind_to_input_names_in_the_models_order():
    features = {"attention_mask": "m", "input_ids": "i", "label_text": "t"}
    assert list(onnx_run.bind_names(["input_ids", "attention_mask"], features).items()) == \
        [("input_ids", "i"), ("attention_mask", "m")]
    assert onnx_run.bind_names(["input"], {"image": "x"}) == {"input": "x"}  # one feature, one input
    with pytest.raises(InvalidInput, match="no values for model input.*attention_mask"):
        onnx_run.bind_names(["input_ids", "attention_mask"], {"input_ids": "i"}, where="the train split")


def test_image_settings_left_out_of_the_recipe_come_from_the_data(tmp_path):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "rgb.npz", x=rng.integers(0, 255, (12, 3, 12, 10), dtype=np.uint8),
             y=np.arange(12) % 2)
    data = {"source": "npz", "path": "rgb.npz"}
    assert archs.image_settings(data, tmp_path) == (3, (12, 10), "NCHW")
    assert archs.image_settings(data) == (1, (8, 8), "NCHW")  # without the folder: the defaults
    assert archs.image_settings({**data, "image": {"size": [6, 5]}}, tmp_path) == (3, (6, 5), "NCHW")
