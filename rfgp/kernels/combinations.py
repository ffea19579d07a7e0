"""Sums, products and scalings of feature kernels that stay feature kernels.

GPyTorch's ``AdditiveKernel``/``ProductKernel`` combine covariance *matrices*, which turns
a sum of low-rank ΦΦᵀ into a generic operator (solved iteratively) and a product into a
dense matrix.  On features the algebra is exact and stays low-rank:

* sum:      k₁ + k₂ ↦ [Φ₁, Φ₂]                       (width F₁ + F₂)
* product:  k₁·k₂   ↦ row-wise Kronecker Φ₁ ⊙ Φ₂     (width F₁·F₂, exact: :class:`FeatureProductKernel`)
            k₁·k₂   ↦ TensorSRHT S(Φ₁ ⊗ Φ₂)          (width F, unbiased: :class:`SketchedProductKernel`)
* scale:    σ²k     ↦ σΦ                              (``gpytorch.kernels.ScaleKernel``)

Products of stationary factors have a third, cheaper form at width F, the convolution of
their spectral measures (:class:`~rfgp.kernels.SpectralProductKernel`).  :func:`rfgp.sketch`
builds these from GPyTorch kernel trees.  Every combination exposes ``num_features``, the
width of its whole Φ.
"""

from __future__ import annotations

import torch
from gpytorch.kernels import Kernel, ScaleKernel
from torch import Tensor, nn

from ..core.dtypes import in_full_precision
from ..features.base import FeatureMap
from ..features.tensor_product import TensorProductSketch
from ..inference.chunking import scaled_features
from .families import check_kernel_kwargs
from .random_feature_kernel import FeatureKernel


def is_feature_kernel(kernel: Kernel) -> bool:
    """Whether ``kernel`` (possibly wrapped in ``ScaleKernel``) is an explicit feature kernel."""
    if isinstance(kernel, ScaleKernel):
        return is_feature_kernel(kernel.base_kernel)
    return isinstance(kernel, FeatureKernel)


def holds_feature_kernel(module) -> bool:
    """Whether an rfgp feature kernel is among ``module``'s submodules, itself included (a traversal of the module
    tree, no evaluation): a model, a kernel tree or anything else (``False`` for what is not an ``nn.Module``)."""
    return isinstance(module, nn.Module) and any(isinstance(sub, FeatureKernel) for sub in module.modules())


def select_active(kernel: Kernel, x: Tensor) -> Tensor:
    """The columns of x that ``kernel`` sees (its ``active_dims``; all of them when unset)."""
    return x if kernel.active_dims is None else x.index_select(-1, kernel.active_dims.to(x.device))


def seen_width(kernel: Kernel, x: Tensor) -> int:
    """The number of input columns ``kernel`` sees: the count of its ``active_dims`` where set, else x's width.

    For ``num_outputs_per_input``, which GPyTorch asks with the columns already selected (``Kernel.__call__``) while a
    ``ScaleKernel``, a sum or a model asks with all of them: the count is right either way (a derivative kernel on
    columns [0, 2] of 3 has 3 outputs per input, not 4)."""
    return x.shape[-1] if kernel.active_dims is None else kernel.active_dims.numel()


def rows_follow_columns(kernel: Kernel) -> bool:
    """Whether a feature kernel's several outputs per input are derivatives along its input columns (derivative and
    curl-/divergence-free kernels: ``outputs_follow_input_columns``), through ``ScaleKernel`` and combinations, rather
    than tasks (a multitask or LCM kernel's rows, the same tasks whatever columns each part sees)."""
    base = unwrap_scale(kernel)[0]
    if isinstance(base, _CombinedFeatureKernel):
        return any(rows_follow_columns(part) for part in base.kernels)
    return getattr(base, "outputs_follow_input_columns", False)


def derivative_columns(kernel: Kernel, input_dim: int) -> tuple[int, ...]:
    """The input columns (of the ``input_dim`` that ``kernel`` is given) along which the rows of a kernel whose rows
    follow its columns (:func:`rows_follow_columns`) are derivatives: those its ``active_dims`` select, and for a
    combination those of its parts (which its own check made agree) within them."""
    seen = tuple(range(input_dim)) if kernel.active_dims is None else tuple(kernel.active_dims.tolist())
    base = unwrap_scale(kernel)[0]
    if not isinstance(base, _CombinedFeatureKernel):
        return seen
    inner = next(derivative_columns(part, len(seen)) for part in base.kernels if rows_follow_columns(part))
    return tuple(seen[i] for i in inner)


def unwrap_scale(kernel: Kernel) -> tuple[Kernel, Tensor | None]:
    """(base kernel, product of the outputscales of the ``ScaleKernel`` wrappers around it or ``None``)."""
    outputscale = None
    while isinstance(kernel, ScaleKernel):
        outputscale = kernel.outputscale if outputscale is None else outputscale * kernel.outputscale
        kernel = kernel.base_kernel
    return kernel, outputscale


def is_exact_feature_kernel(kernel: Kernel) -> bool:
    """Whether Φ(x)ᵀΦ(y) = k(x, y) exactly at a width fixed by the kernel (class attribute ``is_exact``)."""
    return bool(getattr(unwrap_scale(kernel)[0], "is_exact", False))


def kernel_num_features(kernel: Kernel) -> int:
    """The width of Φ of a feature kernel, possibly inside ``ScaleKernel``."""
    return unwrap_scale(kernel)[0].num_features


@in_full_precision
def kernel_features(kernel: Kernel, x: Tensor) -> Tensor:
    """Φ(x) of a feature kernel or a ``ScaleKernel`` around one, honouring ``active_dims``.

    As in GPyTorch, a ``ScaleKernel`` selects its own ``active_dims`` (copied from its base at
    construction) and hands them to its base's ``forward`` without selecting again.  The outputscale s enters as
    the chunked operators' does (:func:`~rfgp.inference.chunking.scaled_features`): folded into the features' own
    evaluation (log s in the sin/cos Function's pair scales) where the base
    :meth:`~rfgp.kernels.FeatureKernel.folds_amplitude`, Φ(x)·√s otherwise.
    """
    x = select_active(kernel, x)
    base, outputscale = unwrap_scale(kernel)
    if not isinstance(base, FeatureKernel):
        raise TypeError(f"{type(base).__name__} is not a feature kernel")
    if base.ard_num_dims is not None and x.shape[-1] != base.ard_num_dims:  # GPyTorch's Kernel.__call__ checks it
        raise ValueError(
            f"x has {x.shape[-1]} input column(s) (after active_dims), but {type(base).__name__} has "
            f"ard_num_dims={base.ard_num_dims}: pass points of shape (..., n, {base.ard_num_dims})"
        )
    root = None if outputscale is None else outputscale.sqrt()
    return scaled_features(x, base.featurize, root, base.amplitude_function())


def kernel_squared_norm(kernel: Kernel, x: Tensor) -> Tensor | None:
    """‖Φ(x)‖² of a feature kernel or a ``ScaleKernel`` around one from its closed form
    (:meth:`~rfgp.kernels.FeatureKernel.feature_squared_norm`), honouring ``active_dims``; ``None`` without one."""
    base, outputscale = unwrap_scale(kernel)
    norms = base.feature_squared_norm(select_active(kernel, x))
    if norms is None or outputscale is None:
        return norms
    return norms * outputscale.unsqueeze(-1)


def kernel_diag_moments(kernel: Kernel, x: Tensor) -> tuple[Tensor, Tensor] | None:
    """(k(x, x), E[k̂(x, x)]) of a feature kernel tree, ``None`` where they agree exactly."""
    base, outputscale = unwrap_scale(kernel)
    moments = base.diag_moments(select_active(kernel, x))
    if moments is None or outputscale is None:
        return moments
    scale = outputscale.unsqueeze(-1)
    return moments[0] * scale, moments[1] * scale


def kernel_variance_correction(kernel: Kernel, x: Tensor) -> Tensor | None:
    """The variance correction of a feature kernel, optionally inside ``ScaleKernel`` (times its outputscale), on the
    columns it sees: a Nyström kernel's k(x, x) − ‖φ(x)‖² in eval mode, a truncated Maclaurin map's bias; ``None``
    for none."""
    base, outputscale = unwrap_scale(kernel)
    correction = base.variance_correction(select_active(kernel, x))
    if correction is None or outputscale is None:
        return correction
    return correction * outputscale.unsqueeze(-1)


def _exact_moments(kernel: Kernel, x: Tensor) -> tuple[Tensor, Tensor]:
    """Diagonal moments, with E[k̂(x, x)] = k̂(x, x) = k(x, x) filled in for unbiased kernels."""
    moments = kernel_diag_moments(kernel, x)
    if moments is not None:
        return moments
    diag = kernel_features(kernel, x).pow(2).sum(-1)
    return diag, diag


class _CombinedFeatureKernel(FeatureKernel):
    def __init__(self, *kernels: Kernel, **kwargs) -> None:
        if len(kernels) < 1:
            raise ValueError("at least one kernel is needed")
        for i, kernel in enumerate(kernels):
            if not is_feature_kernel(kernel):
                raise TypeError(
                    f"kernels[{i}] is a {type(kernel).__name__}; only rfgp feature kernels "
                    "(optionally inside ScaleKernel) can be combined in feature space"
                )
            if getattr(unwrap_scale(kernel)[0], "complex_posterior", False):  # through nested ScaleKernels too
                raise ValueError(
                    f"kernels[{i}] has complex_posterior=True, which combined kernels would silently drop "
                    "(their features are real): use it on a single kernel"
                )
        if not self.combines_outputs:
            refuse_multi_output_factors(kernels, type(self).__name__)
            refuse_shared_draws(kernels, type(self).__name__)
        check_kernel_kwargs(type(self).__name__, kwargs)
        super().__init__(**kwargs)
        self.kernels = nn.ModuleList(kernels)

    #: whether parts with several outputs per input (derivative, operator-valued kernels) may be combined
    combines_outputs = False

    def prepare(self, x: Tensor) -> None:
        """Every part fits on the columns it sees of all of ``x`` (see :meth:`FeatureKernel.prepare`)."""
        for kernel in self.kernels:
            unwrap_scale(kernel)[0].prepare(select_active(kernel, x))

    def num_outputs_per_input(self, x1: Tensor, x2: Tensor) -> int:
        """The parts' common number of outputs per input, counted on the columns this kernel sees (:func:`seen_width`:
        its parts count from the width of what they are given, and a model asks with all the columns)."""
        width = seen_width(self, x1)
        if width != x1.shape[-1]:
            x1 = x2 = x1.new_zeros(1, width)
        outputs = [kernel.num_outputs_per_input(x1, x2) for kernel in self.kernels]
        self._check_same_outputs(outputs, width)
        if outputs[0] > 1:
            self._check_same_derivative_columns(width)
        return outputs[0]

    def _check_same_derivative_columns(self, input_dim: int) -> None:
        """Raise unless parts with several outputs per input see the same input columns in the same order: a
        derivative kernel's rows are ∂/∂x of the columns its ``active_dims`` select, so parts on ``[0]`` and ``[1]``
        (or ``[0, 1]`` and ``[1, 0]``) would add ∂/∂x₀ rows to ∂/∂x₁ rows (GPyTorch's exact sum does so silently for
        the latter)."""
        parts = [k for k in self.kernels if rows_follow_columns(k)]  # not tasks (a multitask or LCM kernel's rows)
        seen = [derivative_columns(k, input_dim) for k in parts]
        self._check_parts_agree(seen, f"see the input columns {[list(s) for s in seen]}, each part's rows being "
                                "derivatives along its own columns", "give every part the same active_dims (in the "
                                "same order)", parts)

    def _check_same_outputs(self, outputs: list[int], input_dim: int) -> None:
        """Raise unless every part has the same number of outputs per input (``outputs``, in the parts' order):
        GPyTorch's ``AdditiveKernel``/``ProductKernel`` cannot combine ``RBFKernelGrad`` with ``RBFKernel`` either."""
        self._check_parts_agree(outputs, f"have {outputs} outputs per input (inputs of dimension {input_dim})",
                                "its parts need the same outputs per input (RBFKernelGrad with Matern52KernelGrad, "
                                "not with RBFKernel or RBFKernelGradGrad)")

    def _check_parts_agree(self, values: list, what: str, remedy: str, parts: list | None = None) -> None:
        """Raise a ValueError naming the parts (``parts``, default all) unless ``values`` (one per part) are all
        equal."""
        if len(set(values)) > 1:
            names = [type(unwrap_scale(kernel)[0]).__name__ for kernel in (self.kernels if parts is None else parts)]
            raise ValueError(f"{type(self).__name__} combines its parts' covariances entry by entry, but its parts "
                             f"{names} {what}; {remedy}")

    def prediction_strategy(self, train_inputs, train_prior_dist, train_labels, likelihood):
        x = train_inputs[0]
        if self.num_outputs_per_input(x, x) > 1:
            from ..inference.multioutput import MultitaskFeatureSpacePredictionStrategy

            return MultitaskFeatureSpacePredictionStrategy(train_inputs, train_prior_dist, train_labels, likelihood)
        return super().prediction_strategy(train_inputs, train_prior_dist, train_labels, likelihood)


def refuse_multi_output_factors(kernels, owner: str) -> None:
    """Products are of scalar kernels only: a factor with several outputs per input raises a TypeError.

    The product of two derivative kernels (or of a derivative and a scalar kernel) is not the
    derivative kernel of the product, so multiplying their roots would be a different model.
    """
    probe = torch.zeros(1, 1)
    outputs = [kernel.num_outputs_per_input(probe, probe) for kernel in kernels]
    if max(outputs) > 1:
        names = [type(unwrap_scale(kernel)[0]).__name__ for kernel in kernels]
        raise TypeError(
            f"{owner} multiplies scalar kernels only; got factors {names} with {outputs} outputs per input "
            "(derivative or operator-valued kernels): the product of derivative kernels is not the derivative "
            "kernel of the product — use the derivative kernel of a scalar kernel instead"
        )


def refuse_shared_draws(kernels, owner: str) -> None:
    """A ValueError where two factors of a product hold the same random draws — one feature map (``FeatureMap``) or
    drawing kernel (one with ``resample``) in both, as in ``FeatureProductKernel(k, k)``: E[k̂₁k̂₂] = E[k̂₁]E[k̂₂] =
    k₁k₂ needs independent draws, and one draw used twice gives k̂², whose mean k² + Var k̂ is biased.  Kernels without
    draws (exact features such as an ``IndexKernel``'s, Nyström's fixed landmarks) may repeat: their k̂ is not
    random."""
    first: dict[int, int] = {}
    for i, kernel in enumerate(kernels):
        draws = {id(module): module for module in kernel.modules()
                 if isinstance(module, FeatureMap) or callable(getattr(module, "resample", None))}
        for key, module in draws.items():
            j = first.setdefault(key, i)
            if j != i:
                raise ValueError(
                    f"{owner} multiplies factors with independent random draws, but kernels[{j}] and kernels[{i}] hold "
                    f"the same {type(module).__name__} instance: its k̂ times itself is k̂², biased for k² by Var k̂; "
                    "give each factor its own kernel (another seed), as rfgp.sketch(k * k) does"
                )


class FeatureSumKernel(_CombinedFeatureKernel):
    r"""k̂ = Σᵢ k̂ᵢ with features [Φ₁, …, Φₖ] (width ΣFᵢ): the low-rank form of ``AdditiveKernel``.

    Parts with p outputs per input (derivative kernels: roots [Φ; ∂Φ/∂x₁; …] in GPyTorch's
    interleaved layout) add the same way, row by row, when every part has the same p.
    """

    combines_outputs = True

    @property
    def num_features(self) -> int:
        return sum(kernel_num_features(kernel) for kernel in self.kernels)

    @property
    def is_exact(self) -> bool:
        """Whether every part has exact finite features (then so has the sum, at its fixed width)."""
        return all(is_exact_feature_kernel(kernel) for kernel in self.kernels)

    def featurize(self, x: Tensor) -> Tensor:
        parts = [kernel_features(kernel, x) for kernel in self.kernels]
        if not torch.jit.is_tracing():  # a trace records sizes as tensors; its kernel calls made the check
            self._check_same_outputs([p.shape[-2] // max(x.shape[-2], 1) for p in parts], x.shape[-1])
        batch = torch.broadcast_shapes(*(p.shape[:-2] for p in parts))
        return torch.cat([p.expand(*batch, *p.shape[-2:]) for p in parts], dim=-1)

    def feature_squared_norm(self, x: Tensor) -> Tensor | None:
        """‖[Φ₁, …, Φₖ]‖² = Σᵢ‖Φᵢ‖² from the parts' closed forms; ``None`` when a part has none (or for a subclass
        with its own :meth:`featurize`)."""
        if type(self).featurize is not FeatureSumKernel.featurize:
            return None
        return _combined_squared_norm(self.kernels, x, torch.add)

    def diag_moments(self, x: Tensor) -> tuple[Tensor, Tensor] | None:
        moments = [kernel_diag_moments(kernel, x) for kernel in self.kernels]
        if all(m is None for m in moments):
            return None
        pairs = [_exact_moments(kernel, x) for kernel in self.kernels]
        return sum(p[0] for p in pairs), sum(p[1] for p in pairs)


class FeatureProductKernel(_CombinedFeatureKernel):
    r"""k̂ = Πᵢ k̂ᵢ with row-wise Kronecker features Φ₁ ⊙ Φ₂ ⊙ … (width ΠFᵢ): the form of ``ProductKernel``.

    The factors use independent draws, so E[Πk̂ᵢ] = ΠE[k̂ᵢ].  The width multiplies: use it for
    small exact factors (an ``IndexKernel``'s task features, a linear kernel); otherwise
    :class:`SketchedProductKernel` or :class:`~rfgp.kernels.SpectralProductKernel` keep width F.
    """

    @property
    def num_features(self) -> int:
        width = 1
        for kernel in self.kernels:
            width *= kernel_num_features(kernel)
        return width

    @property
    def is_exact(self) -> bool:
        return all(is_exact_feature_kernel(kernel) for kernel in self.kernels)

    def featurize(self, x: Tensor) -> Tensor:
        result = None
        for kernel in self.kernels:
            part = kernel_features(kernel, x)
            if result is None:
                result = part
            else:
                result = (result.unsqueeze(-1) * part.unsqueeze(-2)).flatten(-2)
        return result

    def feature_squared_norm(self, x: Tensor) -> Tensor | None:
        """‖Φ₁ ⊙ Φ₂ ⊙ …‖² = Πᵢ‖Φᵢ‖² (the squared norm of a Kronecker product) from the factors' closed forms;
        ``None`` when a factor has none."""
        return _combined_squared_norm(self.kernels, x, torch.mul)

    def diag_moments(self, x: Tensor) -> tuple[Tensor, Tensor] | None:
        return _product_moments(self.kernels, x)


def _combined_squared_norm(kernels, x: Tensor, combine) -> Tensor | None:
    """``combine`` (sum or product) of the parts' closed-form ‖Φᵢ(x)‖²; ``None`` as soon as one part has none."""
    result = None
    for kernel in kernels:
        norms = kernel_squared_norm(kernel, x)
        if norms is None:
            return None
        result = norms if result is None else combine(result, norms)
    return result


def _product_moments(kernels, x: Tensor) -> tuple[Tensor, Tensor] | None:
    """(Πk(x, x), ΠE[k̂(x, x)]) of independent factors, ``None`` when every factor is exact on the diagonal."""
    if all(kernel_diag_moments(kernel, x) is None for kernel in kernels):
        return None
    target = expected = 1.0
    for kernel in kernels:
        t, e = _exact_moments(kernel, x)
        target, expected = target * t, expected * e
    return target, expected


class SketchedProductKernel(_CombinedFeatureKernel):
    r"""k̂ = Πᵢ k̂ᵢ at width F: the TensorSRHT S(Φ₁ ⊗ … ⊗ Φₙ) of the factors' features.

    For products whose factors have no common spectral form (polynomial × RBF, a factor
    without the spectral protocol): the degree-n TensorSRHT of paper 000 (Algorithm 1), applied
    to the n factor feature vectors instead of n copies of one input, see
    :class:`~rfgp.features.tensor_product.TensorProductSketch`.  Unbiased,
    E[k̂] = ΠE[k̂ᵢ], with conditional variance O(Πᵢk̂ᵢ(x, x)k̂ᵢ(y, y)/F) on top of the factors'
    own (paper 000 Thm 6 / Table 1).

    Args:
        kernels: n ≥ 2 feature kernels (optionally inside ``ScaleKernel``).
        num_features: output width F.
        seed, generator: randomness of the sketch (independent of the factors' own draws).
        kwargs: GPyTorch ``Kernel`` arguments (``active_dims``, …).

    Example:
        >>> import torch
        >>> from rfgp.kernels import SketchedPolynomialKernel, SketchedProductKernel, SketchedRBFKernel
        >>> poly = SketchedPolynomialKernel(2, num_features=512, seed=0)
        >>> product = SketchedProductKernel(poly, SketchedRBFKernel(512, seed=1), num_features=512, seed=2)
        >>> product(torch.rand(10, 3)).shape
        torch.Size([10, 10])
    """

    def __init__(self, *kernels: Kernel, num_features: int, seed: int | None = None,
                 generator: torch.Generator | None = None, **kwargs) -> None:
        super().__init__(*kernels, **kwargs)
        widths = [kernel_num_features(kernel) for kernel in self.kernels]
        self.sketch = TensorProductSketch(len(kernels), num_features, input_dim=max(widths), seed=seed,
                                          generator=generator)

    @property
    def num_features(self) -> int:
        return self.sketch.num_features

    def featurize(self, x: Tensor) -> Tensor:
        return self.sketch([kernel_features(kernel, x) for kernel in self.kernels])

    def diag_moments(self, x: Tensor) -> tuple[Tensor, Tensor] | None:
        # the sketch is unbiased given the factor features: the expectations are the factors'
        return _product_moments(self.kernels, x)

