"""Tests of zoo_stages.lib.quality.tasks: the task kinds, the output the metrics read, and the metrics
themselves, against scikit-learn's metric functions on real data (digits, diabetes)."""

from __future__ import annotations

import numpy as np
import pydantic
import pytest
from sklearn import metrics as skm

from zoo.engine.recipe import recipe_model
from zoo.errors import InvalidInput
from zoo_stages.lib.quality import tasks
from zoo_stages.lib.runtimes.onnx_run import TensorSpec
from zoo_stages.sections.task import task_kind


@pytest.fixture(scope="module")
def digits():
    """A deliberately weak classifier on digits (strong regularisation, few features), so every metric
    is strictly between 0 and 1 and the classes' F1 scores differ."""
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression

    x, y = load_digits(return_X_y=True)
    x = x[:, ::6]
    clf = LogisticRegression(C=1e-3, max_iter=2000).fit(x[:1200], y[:1200])
    return clf.predict_proba(x[1200:]).astype(np.float32), clf.predict(x[1200:]).astype(np.int64), y[1200:]


@pytest.fixture(scope="module")
def diabetes():
    from sklearn.datasets import load_diabetes
    from sklearn.linear_model import Ridge

    x, y = load_diabetes(return_X_y=True)
    pred = Ridge(alpha=0.5).fit(x[:350], y[:350]).predict(x[350:])
    return pred, y[350:]


# -- kinds -------------------------------------------------------------------------------------


@pytest.mark.parametrize("task,kind", [
    ("classification", "classification"), ("image-classification", "classification"),
    ("text-classification", "classification"), ("tabular-classification", "classification"),
    ("regression", "regression"), ("tabular-regression", "regression"),
    ("generic", "generic"), ("object-detection", "generic"), ("feature-extraction", "generic"),
    ("embedding", "generic"), ("image-segmentation", "generic"),
])
def test_kind_of_maps_every_documented_spelling(task, kind):
    assert tasks.kind_of(task) == kind
    assert recipe_model().model_validate({"schema_version": 1, "name": "m", "version": "1.0.0", "task": task,
                                      "stages": {"s": {}}}).task == task


@pytest.mark.parametrize("task,message", [
    ("image-clasification", "did you mean 'image-classification'"),
    ("tabular-regressor", "did you mean 'tabular-regression'"),
    ("image-classifier", "did you mean 'image-classification'"),
    ("Image-Classification", "lowercase"),
    ("image classification", "lowercase"),
])
def test_misspelt_or_malformed_tasks_are_refused(task, message):
    with pytest.raises(ValueError, match=message):
        task_kind(task)
    with pytest.raises(InvalidInput, match=message):
        tasks.kind_of(task)
    with pytest.raises(pydantic.ValidationError):
        recipe_model().model_validate({"schema_version": 1, "name": "m", "version": "1.0.0", "task": task,
                                   "stages": {"s": {}}})


def test_primary_metrics_and_comparison_names():
    assert tasks.primary_metric("classification") == ("accuracy", True)
    assert tasks.primary_metric("regression") == ("mae", False)
    assert tasks.primary_metric("generic") is None
    assert [tasks.comparison_name(m) for m in ("accuracy", "mae", "rmse", "r2")] == \
        ["accuracy_drop", "mae_increase", "rmse_increase", "r2_drop"]
    # positive always means worse than the reference
    assert tasks.compare("accuracy", 0.9, 0.85) == pytest.approx(0.05)
    assert tasks.compare("mae", 2.0, 2.5) == pytest.approx(0.5)
    assert tasks.compare("mae", None, 2.5) is None
    assert set(tasks.METRICS) == {"classification", "regression", "generation", "generic"}
    assert tasks.METRICS["generic"] == {}
    assert all(m in tasks.HIGHER_IS_BETTER for kind in tasks.METRICS.values() for m in kind)


def test_generation_is_a_kind_and_its_perplexity_increase_is_relative():
    assert tasks.kind_of("text-generation") == "generation" and tasks.kind_of("generation") == "generation"
    assert tasks.primary_metric("generation") == ("perplexity", False)
    assert tasks.comparison_name("perplexity") == "perplexity_increase"
    # relative: 0.05 is 5% above the reference, whatever the perplexity's scale
    assert tasks.compare("perplexity", 20.0, 21.0) == pytest.approx(0.05)
    assert tasks.compare("perplexity", 200.0, 190.0) == pytest.approx(-0.05)
    assert tasks.compare("perplexity", 0.0, 1.0) is None and tasks.compare("perplexity", None, 1.0) is None
    # nothing comes from outputs and labels: verify computes perplexity from a decoder's runs
    assert tasks.applicable("generation", labelled=True, scores="logits", label=None, classes=None) == []
    assert tasks.evaluate("generation", {"logits": np.zeros((2, 3))}, np.zeros(2), "logits") == {}
    with pytest.raises(InvalidInput, match="text-generation"):
        tasks.kind_of("text-genaration")


# -- which output ------------------------------------------------------------------------------


def spec(name, dtype, shape):
    return TensorSpec(name, dtype, tuple(shape) if shape is not None else None)


SKLEARN = [spec("label", "int64", [None]), spec("probabilities", "float32", [None, 3])]
DETECTOR = [spec("mask", "float32", ["N", 1, 32, 32])]


def test_scores_output_picks_the_output_that_fits_the_task():
    assert tasks.scores_output(SKLEARN) == "probabilities"
    assert tasks.label_output(SKLEARN) == "label"
    assert tasks.scores_output([spec("logits", "float32", ["N", 10])]) == "logits"
    assert tasks.scores_output([spec("probs", "float32", ["N", 4]), spec("scores16", "float16", ["N", 4])]) == "probs"
    assert tasks.scores_output([spec("probs", "float32", ["N", 4]), spec("scores16", "float16", ["N", 4])],
                               "scores16") == "scores16"
    # a detector's mask, a single logit, a scalar: not class scores
    assert tasks.scores_output(DETECTOR) is None and tasks.label_output(DETECTOR) is None
    assert tasks.scores_output([spec("p", "float32", ["N", 1])]) is None
    assert tasks.scores_output([spec("total", "float32", [])]) is None
    # regression reads (samples,) or (samples, 1)
    assert tasks.scores_output([spec("y", "float32", ["N", 1])], kind="regression") == "y"
    assert tasks.scores_output([spec("e", "float32", ["N", 8]), spec("y", "float32", ["N"])], kind="regression") == "y"
    assert tasks.scores_output([spec("e", "float32", ["N", 8])], kind="regression") is None
    assert tasks.scores_output(SKLEARN, kind="generic") is None


def test_a_preferred_output_must_exist_and_fit():
    with pytest.raises(InvalidInput, match="'logits' is not an output"):
        tasks.scores_output(SKLEARN, "logits")
    with pytest.raises(InvalidInput, match="'label' .* cannot be read as classification scores"):
        tasks.scores_output(SKLEARN, "label")


def test_applicable_metrics():
    assert tasks.applicable("classification", labelled=True, scores="p", label=None, classes=10) == \
        ["accuracy", "top5_accuracy", "macro_f1"]
    assert tasks.applicable("classification", labelled=True, scores="p", label=None, classes=5) == \
        ["accuracy", "macro_f1"]
    assert tasks.applicable("classification", labelled=True, scores=None, label="label", classes=None) == \
        ["accuracy", "macro_f1"]
    assert tasks.applicable("classification", labelled=True, scores=None, label=None, classes=None) == []
    assert tasks.applicable("classification", labelled=False, scores="p", label=None, classes=10) == []
    assert tasks.applicable("regression", labelled=True, scores="y", label=None, classes=None) == ["mae", "rmse", "r2"]
    assert tasks.applicable("generic", labelled=True, scores="y", label="l", classes=3) == []


# -- the metrics, against scikit-learn -----------------------------------------------------------


def test_classification_metrics_match_scikit_learn(digits):
    proba, _, y = digits
    got = tasks.evaluate("classification", {"probabilities": proba}, y, "probabilities")
    pred = proba.argmax(axis=1)
    assert got["accuracy"] == pytest.approx(skm.accuracy_score(y, pred), abs=1e-12)
    assert got["top5_accuracy"] == pytest.approx(skm.top_k_accuracy_score(y, proba, k=5, labels=range(10)), abs=1e-12)
    assert got["macro_f1"] == pytest.approx(skm.f1_score(y, pred, average="macro"), abs=1e-12)
    assert 0.3 < got["accuracy"] < got["top5_accuracy"] < 1.0  # the fixture is weak enough to tell them apart


def test_accuracy_comes_from_the_label_output_exactly(digits):
    proba, label, y = digits
    # a label output that disagrees with the scores' argmax on some samples: accuracy follows the label
    label = label.copy()
    label[:40] = (label[:40] + 1) % 10
    got = tasks.evaluate("classification", {"label": label, "probabilities": proba}, y, "probabilities",
                         label_output="label")
    assert got["accuracy"] == skm.accuracy_score(y, label)
    assert got["macro_f1"] == pytest.approx(skm.f1_score(y, label, average="macro"), abs=1e-12)
    assert got["top5_accuracy"] == pytest.approx(skm.top_k_accuracy_score(y, proba, k=5, labels=range(10)), abs=1e-12)
    # a label output alone: no top-k
    only = tasks.evaluate("classification", {"label": label}, y, None, label_output="label")
    assert set(only) == {"accuracy", "macro_f1"} and only["accuracy"] == got["accuracy"]


def test_macro_f1_counts_classes_that_occur_only_in_predictions():
    y = np.array([0, 0, 1, 1])
    pred = np.array([0, 2, 1, 1])
    assert tasks.macro_f1(y, pred) == pytest.approx(skm.f1_score(y, pred, average="macro"))


def test_top_k_ties_break_like_scikit_learn():
    scores = np.array([[0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.0], [1, 1, 1, 1, 1, 1, 1]], dtype=np.float32)
    y = np.array([0, 6])
    assert tasks.top_k_accuracy(scores, y, 5) == skm.top_k_accuracy_score(y, scores, k=5, labels=range(7))


def test_no_top5_with_five_classes_or_fewer(digits):
    proba, _, y = digits
    keep = y < 5
    got = tasks.evaluate("classification", {"p": proba[keep][:, :5]}, y[keep], "p")
    assert set(got) == {"accuracy", "macro_f1"}


def test_a_label_the_scores_do_not_have_is_refused(digits):
    proba, _, y = digits
    with pytest.raises(InvalidInput, match="label 9 but the model outputs 5 classes"):
        tasks.evaluate("classification", {"p": proba[:, :5]}, y, "p")


@pytest.mark.parametrize("column", [False, True])
def test_regression_metrics_match_scikit_learn(diabetes, column):
    pred, y = diabetes
    out = pred[:, None] if column else pred
    got = tasks.evaluate("regression", {"y": out}, y, "y")
    assert got["mae"] == pytest.approx(skm.mean_absolute_error(y, pred), rel=1e-9)
    assert got["rmse"] == pytest.approx(np.sqrt(skm.mean_squared_error(y, pred)), rel=1e-9)
    assert got["r2"] == pytest.approx(skm.r2_score(y, pred), rel=1e-9)
    assert 0.2 < got["r2"] < 0.8


def test_r2_of_constant_targets_follows_scikit_learn():
    y = np.full(4, 3.0)
    for pred in (np.full(4, 3.0), np.array([3.0, 3.0, 3.0, 4.0])):
        assert tasks.regression_metrics(y, pred)["r2"] == skm.r2_score(y, pred)


def test_generic_and_label_less_give_no_metrics(digits):
    proba, _, y = digits
    assert tasks.evaluate("generic", {"p": proba}, y, "p") == {}
    assert tasks.evaluate("classification", {"p": proba}, None, "p") == {}
    assert tasks.evaluate("regression", {"p": proba}, y, None) == {}
