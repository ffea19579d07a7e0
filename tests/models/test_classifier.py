"""DirichletGPClassifier: scikit-learn-like fit/predict on a small, well-separated problem."""

import numpy as np
import pytest
import torch

from rfgp.models import DirichletGPClassifier


def _blobs(num_per_class=60, seed=0):
    rng = np.random.default_rng(seed)
    centres = np.array([[0.0, 0.0], [3.0, 0.0], [0.0, 3.0]])
    x = np.concatenate([c + 0.6 * rng.standard_normal((num_per_class, 2)) for c in centres])
    y = np.repeat(np.array(["a", "b", "c"]), num_per_class)
    order = rng.permutation(len(y))
    return x[order], y[order]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fit_predict_on_separable_blobs(dtype):
    x, y = _blobs()
    clf = DirichletGPClassifier(num_features=64, num_iterations=10, dtype=dtype, progress=False).fit(x, y)
    probs = clf.predict_proba(x)
    assert probs.shape == (180, 3) and probs.dtype == (np.float32 if dtype == torch.float32 else np.float64)
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)
    assert (clf.predict(x) == y).mean() > 0.95
    assert list(clf.classes_) == ["a", "b", "c"]
    assert clf.losses_[-1] < clf.losses_[0]
    tensor_probs = clf.predict_proba(torch.as_tensor(x[:5]))
    assert torch.is_tensor(tensor_probs) and tensor_probs.dtype == dtype
    # far from the data the classifier is uncertain
    far = clf.predict_proba(np.array([[30.0, -30.0]]))
    assert far.max() < 0.6


def test_alpha_chosen_by_validation_mnll_and_mean_field_probabilities():
    x, y = _blobs(40)
    clf = DirichletGPClassifier(
        num_features=64, num_iterations=5, alpha_epsilon=[0.001, 0.3], probability_method="mean_field", progress=False
    ).fit(x, y)
    assert set(clf.validation_mnll_) == {0.001, 0.3}
    assert clf.alpha_epsilon_ == min(clf.validation_mnll_, key=clf.validation_mnll_.get)
    assert np.isfinite(list(clf.validation_mnll_.values())).all()
    # deterministic probabilities: two calls agree exactly
    np.testing.assert_array_equal(clf.predict_proba(x[:7]), clf.predict_proba(x[:7]))


def test_classifier_arguments_validated():
    with pytest.raises(ValueError, match="method"):
        DirichletGPClassifier(method="fft")
    with pytest.raises(ValueError, match="alpha_epsilon"):
        DirichletGPClassifier(alpha_epsilon=[0.1, -1.0])
    with pytest.raises(RuntimeError, match="not fitted"):
        DirichletGPClassifier().predict(np.zeros((2, 2)))
    x, y = _blobs(10)
    with pytest.raises(ValueError, match="one per row"):
        DirichletGPClassifier(num_iterations=0).fit(x, y[:-1])
    with pytest.raises(ValueError, match="at least two classes"):
        DirichletGPClassifier(num_iterations=0).fit(x, np.zeros(len(x)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_constant_training_column_is_not_scaled(dtype):
    # a one-hot column of a category absent from the training data: 0 in training, 1 at some test points. Its
    # standard deviation (0, or rounding noise for a constant 2000.1) used to be clamped to 1e-12, so a test
    # value of 1 became 1e12 standardised units and the prediction went to nonsense (wine: accuracy 1.0 -> 0.44)
    x, y = _blobs()
    train_x = np.c_[x, np.zeros(len(y)), np.full(len(y), 2000.1)]
    clf = DirichletGPClassifier(num_features=256, num_iterations=10, dtype=dtype, progress=False).fit(train_x, y)
    torch.testing.assert_close(clf.input_scale_[-2:], torch.ones(2, dtype=dtype))
    assert float(clf.input_scale_[0]) > 0.5
    test_x = np.c_[x[:30], np.ones(30), np.full(30, 2000.1)]
    shifted = clf.predict_proba(test_x)  # one standardised unit off in one column: still confident
    assert shifted[np.arange(30), np.searchsorted(clf.classes_, y[:30])].min() > 0.6  # 1e12 units: ≈ 1/3
    assert (clf.predict(test_x) == y[:30]).mean() > 0.95
