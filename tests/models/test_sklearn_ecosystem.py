"""rfgp's estimators inside scikit-learn's tools: column transformers with pandas output, parallel cross-validation,
persistence, meta-estimators and inspection (each passed when written; guarded here, small and fast)."""

import copy
import io
import pickle

import numpy as np
import pytest

from rfgp.models import DirichletGPClassifier, GPRegressor

pandas = pytest.importorskip("pandas")
pytest.importorskip("sklearn")


def _data(num_rows=120, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(num_rows, 3))
    y = np.sin(x[:, 0]) + x[:, 1] + 0.1 * rng.normal(size=num_rows)
    return x, y, (x[:, 0] + x[:, 1] > 0).astype(int)


def _regressor(**kwargs):
    return GPRegressor(num_features=64, num_iterations=5, progress=False, **kwargs)


def _classifier(**kwargs):
    return DirichletGPClassifier(num_features=64, num_iterations=5, num_samples=64, progress=False, **kwargs)


def test_column_transformer_with_pandas_output():
    from sklearn.compose import ColumnTransformer
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    x, y, labels = _data()
    frame = pandas.DataFrame({"a": x[:, 0], "b": x[:, 1], "c": x[:, 2], "kind": ["u", "v", "w"] * 40})
    for estimator, target in ((_regressor(), y), (_classifier(), labels)):
        columns = ColumnTransformer([("num", StandardScaler(), ["a", "b", "c"]),
                                     ("cat", OneHotEncoder(sparse_output=False), ["kind"])])
        pipeline = Pipeline([("columns", columns), ("model", estimator)]).set_output(transform="pandas").fit(frame,
                                                                                                              target)
        assert list(pipeline[-1].feature_names_in_) == ["num__a", "num__b", "num__c", "cat__kind_u", "cat__kind_v",
                                                        "cat__kind_w"]
        assert pipeline.score(frame, target) > 0.9
        # the transformer selects by name, so the model sees its columns in the fitted order (the model itself
        # refuses reordered columns by name: test_feature_names_follow_scikit_learn)
        np.testing.assert_array_equal(pipeline.predict(frame[["kind", "c", "b", "a"]]), pipeline.predict(frame))


def test_persistence_and_clone():
    import joblib
    from sklearn.base import clone

    x, y, labels = _data()
    for estimator, target, method in ((_regressor(), y, "predict"), (_classifier(), labels, "predict_proba")):
        fitted = estimator.fit(x, target)
        expected = getattr(fitted, method)(x)
        buffer = io.BytesIO()
        joblib.dump(fitted, buffer)
        buffer.seek(0)
        for restored in (pickle.loads(pickle.dumps(fitted)), joblib.load(buffer), copy.deepcopy(fitted)):
            np.testing.assert_array_equal(getattr(restored, method)(x), expected)
        assert not hasattr(clone(fitted), "model_")


def test_pickles_leave_the_prediction_caches_out():
    """A fitted estimator's posterior caches (F × F factors per class or output) were pickled with it after its first
    prediction: a 16-class classifier at F = 1 024 grew from 0.35 MB to 92 MB.  They are rebuilt, with the same
    values, at the first prediction after loading; the estimator pickled keeps its own."""
    x, y, labels = _data()
    for estimator, target, method in ((_regressor(), y, "predict"), (_classifier(), labels, "predict_proba")):
        fitted = estimator.fit(x, target)
        before = len(pickle.dumps(fitted))
        expected = getattr(fitted, method)(x)
        strategy = fitted.model_.prediction_strategy
        assert strategy is not None
        pickled = pickle.dumps(fitted)
        assert len(pickled) < 1.1 * before
        assert fitted.model_.prediction_strategy is strategy  # the live estimator keeps its caches
        restored = pickle.loads(pickled)
        assert restored.model_.prediction_strategy is None and restored.likelihood_ is restored.model_.likelihood
        np.testing.assert_array_equal(getattr(restored, method)(x), expected)


def test_cross_validation():
    from sklearn.model_selection import cross_val_predict, cross_val_score

    x, y, labels = _data()
    # n_jobs=2 passes too (loky pickles the unfitted estimator; torch runs one thread per worker), but starting the
    # workers' torch and rfgp took 6-13 s on the test machine, so the fits run in this process here
    assert cross_val_score(_regressor(), x, y, cv=2).min() > 0.9
    probabilities = cross_val_predict(_classifier(), x, np.array(["no", "yes"])[labels], cv=2, method="predict_proba")
    assert probabilities.shape == (120, 2) and np.allclose(probabilities.sum(1), 1)


def test_meta_estimators_and_inspection():
    from sklearn.calibration import CalibratedClassifierCV
    from sklearn.compose import TransformedTargetRegressor
    from sklearn.ensemble import StackingRegressor
    from sklearn.inspection import partial_dependence, permutation_importance
    from sklearn.linear_model import Ridge
    from sklearn.multioutput import MultiOutputRegressor

    x, y, labels = _data()
    positive = np.exp(y)
    logged = TransformedTargetRegressor(regressor=_regressor(), func=np.log1p, inverse_func=np.expm1)
    assert logged.fit(x, positive).score(x, positive) > 0.9
    targets = np.c_[y, x[:, 2] - y]
    separate, shared = MultiOutputRegressor(_regressor()).fit(x, targets), _regressor().fit(x, targets)
    assert abs(separate.score(x, targets) - shared.score(x, targets)) < 0.02
    stack = StackingRegressor([("gp", _regressor()), ("ridge", Ridge())], cv=2)
    assert stack.fit(x, y).score(x, y) > 0.9
    # no sample_weight in fit's signature: scikit-learn's meta-estimators see that and say so
    with pytest.raises(TypeError, match="GPRegressor does not support sample weights"):
        stack.fit(x, y, sample_weight=np.ones(len(y)))
    fitted = _regressor().fit(x, y)
    importances = permutation_importance(fitted, x, y, n_repeats=2, random_state=0).importances_mean
    assert importances[2] < 0.1 < importances[0] < importances[1]
    assert partial_dependence(fitted, x, [0], grid_resolution=5)["average"].shape == (1, 5)
    calibrated = CalibratedClassifierCV(_classifier(), cv=2).fit(x, labels)
    assert (calibrated.predict(x) == labels).mean() > 0.9


def test_sparse_inputs_are_refused_by_name():
    """Sparse X and y are refused naming the argument, in every format: a torch sparse tensor crashed inside torch
    (``NotImplementedError: Could not run 'aten::ne.Scalar' ... 'SparseCPU' backend``, or "unsupported tensor layout:
    SparseCsr"), a SciPy sparse y was called non-numeric with advice to one-hot encode it, and a sparse X from a
    Pipeline's encoder was told ``X.toarray()``, which a Pipeline gives no place for."""
    import scipy.sparse
    import torch
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder

    x, y, labels = _data(30)
    dense = torch.as_tensor(x)
    for estimator, target in ((_regressor(), y), (_classifier(), labels)):
        for sparse_x in (dense.to_sparse(), dense.to_sparse_csr(), scipy.sparse.csr_array(x)):
            with pytest.raises(TypeError, match="X is a sparse .*pass X.to_dense|X is a sparse .*pass X.toarray"):
                estimator.fit(sparse_x, target)
        fitted = estimator.fit(x, target)
        with pytest.raises(TypeError, match=r"X is a sparse tensor \(layout torch.sparse_coo\).*X.to_dense\(\)"):
            fitted.predict(dense.to_sparse())
        for sparse_y in (torch.as_tensor(target).to_sparse(), scipy.sparse.csr_matrix(target[:, None])):
            with pytest.raises(TypeError, match="y is a sparse"):
                estimator.fit(x, sparse_y)
    # a Pipeline's encoder: the message names the dense-output switches
    with pytest.raises(TypeError, match=r"sparse_output=False.*sparse_threshold=0"):
        make_pipeline(OneHotEncoder(), _regressor()).fit(np.round(x), y)
