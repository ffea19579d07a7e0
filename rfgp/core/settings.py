"""Global settings of rfgp, used as context managers or set for the whole process.

* :class:`memory_budget` — bytes that feature matrices Φ may occupy during one
  marginal-likelihood-and-gradient evaluation or one posterior update.  When the
  N × F working set of a kernel call exceeds it, rfgp kernels return operators that
  compute their feature statistics ΦᵀD⁻¹Φ and ΦᵀD⁻¹r chunk by chunk, so that peak
  memory is O(chunk·F + F²) instead of O(N·F), with the same results to rounding (O(chunk·F + B·F²) for a batch of B
  GPs, whose F × F part is not chunked: :class:`rfgp.MemoryBudgetWarning` where it alone exceeds the budget).  The
  posterior at a test set
  whose features exceed it is formed a chunk of test points at a time, too
  (:meth:`rfgp.inference.prediction.FeatureSpacePredictionStrategy.exact_prediction`).
  Multi-output (vector-field) kernels chunk their n·p-row roots a block of points at a time, for
  training (marginal likelihood, gradients, posterior caches) and prediction
  (:mod:`rfgp.inference.multioutput_chunking`); a sketched ``MultitaskKernel`` (root φ ⊗ B) is sized by
  its data features φ and keeps its Kronecker statistics, from φ whole or in row blocks
  (:mod:`rfgp.inference.chunked_kronecker`).
* :class:`chunk_size` — force a number of rows per chunk (``None``: derive it from
  the budget).
* :class:`float32_statistics_tolerance` — the largest estimated rounding error u·tr(ΦᵀWΦ) at which float32
  features form their statistics ΦᵀWΦ, ΦᵀWr in float32; above it, in float64
  (:mod:`rfgp.inference.statistics_precision`).
* :class:`validate_inputs` — ``False`` skips the checks that read the data's values (NaN/Inf
  in inputs and targets, label ranges, unit norms): one fused reduction and one host sync per
  call each.  For data you have validated yourself; shape and dtype checks always run.

Every setting is process-wide, not per thread: a context entered in one thread applies to every thread until it is
left (guide/conventions.md, "Threads"); set values for a server once at start-up with ``set_global``.

Example:
    >>> import torch, gpytorch, rfgp
    >>> g = torch.Generator().manual_seed(0)
    >>> train_x = torch.rand(200, 1, generator=g, dtype=torch.float64)
    >>> train_y = torch.sin(6 * train_x[:, 0]) + 0.1 * torch.randn(200, generator=g, dtype=torch.float64)
    >>> kernel = gpytorch.kernels.ScaleKernel(rfgp.kernels.SketchedRBFKernel(512, seed=0))
    >>> likelihood = gpytorch.likelihoods.GaussianLikelihood()
    >>> model = rfgp.models.ExactGPModel(train_x, train_y, likelihood, kernel).double()
    >>> mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    >>> with rfgp.settings.memory_budget(256 * 2**20):   # 256 MiB for Φ
    ...     loss = -mll(model(train_x), train_y)
    >>> rfgp.settings.chunk_size.set_global(10_000)       # always chunk, 10k rows
    >>> rfgp.settings.chunk_size.set_global(None)         # back to the default
"""

from __future__ import annotations

import math
import numbers
import sys
import threading

import torch

#: Arrays of size N·F alive at once in an MLL backward pass: Φ (saved), ∂Φ and the feature
#: map's autograd intermediates (projections and their gradient, half width each).  Measured
#: peak for sin/cos features, N = 5·10⁴, F = 1024, float64: 3.3 N × F copies.
WORKING_COPIES = 4


#: guards the settings' lists of entered contexts (entering and leaving; reading the innermost needs no lock)
_OVERRIDES_LOCK = threading.Lock()


class _ValueSetting:
    """A process-wide value with a context manager that overrides it temporarily.

    The value is that of the innermost context entered and not yet left, else the one ``set_global`` gave.  Leaving a
    context removes its own override, wherever it is among those entered: restoring the value seen on entry instead
    left a budget set for good where contexts did not nest — threads whose ``with`` blocks overlapped (A enters, B
    enters, A leaves, B leaves restored A's value for the process; the independent-outputs kernel enters
    ``memory_budget(budget // T)`` in every evaluation), or one instance entered twice (its second entry overwrote
    the value to restore).  ``set_global`` inside a context changes the value seen once the contexts are left.
    """

    _global_value = None
    _name = "value"

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        cls._overrides = []  # (entry, value) of the contexts entered and not left, innermost last

    def __init__(self, value) -> None:
        self._value = self._check(value)
        self._entries = []  # this instance's entries not yet left (an instance may be entered again, nested)

    @classmethod
    def _check(cls, value):
        from .validation import check_positive_int  # _validation reads validate_inputs from this module

        return value if value is None else check_positive_int(value, cls._name)

    @classmethod
    def value(cls):
        try:
            return cls._overrides[-1][1]
        except IndexError:  # no context entered (or the last one left since the list was read)
            return cls._global_value

    @classmethod
    def set_global(cls, value) -> None:
        cls._global_value = cls._check(value)

    def __enter__(self):
        entry = object()
        with _OVERRIDES_LOCK:
            type(self)._overrides.append((entry, self._value))
            self._entries.append(entry)
        return self

    def __exit__(self, *exc) -> bool:
        with _OVERRIDES_LOCK:
            entry = self._entries.pop()
            overrides = type(self)._overrides
            del overrides[next(i for i, (e, _) in enumerate(overrides) if e is entry)]
        return False


class memory_budget(_ValueSetting):
    """Bytes the N × F feature matrices of one kernel evaluation may use (default 1 GiB).

    The F × F statistics of the solve are not chunked: for a batch of B independent GPs they are B of them, about
    6·B·F² numbers for a marginal likelihood and its gradient, 3·B·F² for a posterior (float64 factors).  Where
    those alone exceed the budget, forming them warns (:class:`rfgp.MemoryBudgetWarning`, naming B, F, the bytes and
    how many members would fit).
    """

    _global_value = 2**30
    _name = "memory_budget"

    @classmethod
    def _check(cls, value):
        from .validation import check_positive_int

        return check_positive_int(value, cls._name)


class validate_inputs(_ValueSetting):
    """Whether rfgp checks the values of data at its boundaries (default ``True``).

    The checks are NaN/Inf in inputs and targets, class labels in 0..C−1 and unit-norm rows
    where the unit sphere is required; each is one fused reduction (one host sync) per call.
    Turn them off only for data you have validated: a NaN then propagates silently.

    Example:
        >>> import torch, gpytorch, rfgp
        >>> g = torch.Generator().manual_seed(0)
        >>> train_x = torch.rand(200, 1, generator=g, dtype=torch.float64)
        >>> train_y = torch.sin(6 * train_x[:, 0]) + 0.1 * torch.randn(200, generator=g, dtype=torch.float64)
        >>> kernel = gpytorch.kernels.ScaleKernel(rfgp.kernels.SketchedRBFKernel(512, seed=0))
        >>> likelihood = gpytorch.likelihoods.GaussianLikelihood()
        >>> model = rfgp.models.ExactGPModel(train_x, train_y, likelihood, kernel).double()
        >>> mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
        >>> with rfgp.settings.validate_inputs(False):
        ...     loss = -mll(model(train_x), train_y)
    """

    _global_value = True
    _name = "validate_inputs"

    @classmethod
    def _check(cls, value):
        if not isinstance(value, bool):
            raise TypeError(f"validate_inputs must be True or False, got {value!r}")
        return value

    @classmethod
    def on(cls) -> bool:
        return cls.value()


class float32_statistics_tolerance(_ValueSetting):
    """Largest estimated rounding error of float32 feature statistics that rfgp accepts (default 10⁻¹).

    float32 features form G = ΦᵀWΦ and B = ΦᵀWr in float32 while u·tr(G) ≤ this value (u = 2⁻²⁴, the unit roundoff),
    in float64 otherwise: the float32 statistics' rounding is about u·tr(G) or less, against the eigenvalue 1 of
    I + G (:mod:`rfgp.inference.statistics_precision`, which derives and measures it).  The precision changes the
    accuracy of the same model, never the model.  ``0`` always forms them in float64, ``math.inf`` always in float32;
    neither reads the data, so neither costs the decision's host synchronisation.  float64 models are unaffected.

    Example:
        >>> import rfgp
        >>> with rfgp.settings.float32_statistics_tolerance(0.0):   # float64 statistics for float32 data
        ...     pass
    """

    #: chosen from benchmarks/results/float32_statistics_threshold.md (see rfgp.inference.statistics_precision)
    DEFAULT = 1e-1
    _global_value = DEFAULT
    _name = "float32_statistics_tolerance"

    @classmethod
    def _check(cls, value):
        accepted = "a real number ≥ 0 (math.inf: always float32 statistics, 0: always float64)"
        if isinstance(value, bool) or not isinstance(value, numbers.Real):  # NumPy's floats and ints are Real
            raise TypeError(f"float32_statistics_tolerance must be {accepted}, got {type(value).__name__} {value!r}")
        if not value >= 0:  # negative or NaN (math.isnan would overflow on an int beyond float's range)
            raise ValueError(f"float32_statistics_tolerance must be {accepted}, got {value!r}")
        return math.inf if isinstance(value, int) and value > sys.float_info.max else float(value)  # beyond: ∞


class chunk_size(_ValueSetting):
    """Rows per chunk of feature statistics; ``None`` (default) derives it from :class:`memory_budget`."""

    _global_value = None
    _name = "chunk_size"


def chunking_cause() -> tuple[str, str]:
    """(why rows are evaluated in chunks, what undoes it), for the message of a path that cannot be chunked: a forced
    :class:`chunk_size`, else the :class:`memory_budget`, as :func:`resolve_chunk_size` decides."""
    forced = chunk_size.value()
    if forced is not None:
        return f"in chunks of rfgp.settings.chunk_size({forced}) rows", "leave rfgp.settings.chunk_size unset"
    return f"over rfgp.settings.memory_budget ({memory_budget.value()} bytes)", "raise rfgp.settings.memory_budget"


def resolve_chunk_size(num_rows: int, num_features: int, batch_numel: int, dtype: torch.dtype) -> int | None:
    """Rows per chunk for a ``(batch, num_rows, num_features)`` feature matrix, ``None`` for no chunking.

    A forced :class:`chunk_size` smaller than ``num_rows`` always chunks; otherwise the
    matrix is chunked only when its working set exceeds :class:`memory_budget`.
    """
    forced = chunk_size.value()
    if forced is not None:
        return forced if forced < num_rows else None
    # element_size, not finfo: invalid (complex, integer) inputs must reach the feature map's own check.
    row_bytes = WORKING_COPIES * num_features * batch_numel * torch.empty((), dtype=dtype).element_size()
    if row_bytes * num_rows <= memory_budget.value():
        return None
    return max(1, memory_budget.value() // row_bytes)
