"""Warn before :func:`rfgp.fit_mll` trains a random Fourier map from a lengthscale far below the data's spacing,
or a Gaussian likelihood on targets that vary less than its noise floor.

Raw columns (ages in years, serum levels in mg/dl, calendar years, incomes) at GPyTorch's initial lengthscale
ℓ = 0.69 put the training points hundreds of lengthscales apart.  The exact kernel is then ≈ 0 between all of them:
its marginal likelihood is flat in ℓ and an exact GP stays a white-noise model around the mean.  The random-feature
estimate k̂(x, x') = Φ(x)ᵀΦ(x') is not ≈ 0 there but Monte-Carlo noise of size ≈ 1/√F, and its lengthscale derivative,
Σ (ωᵀτ/ℓ)·sin(ωᵀτ)/m, grows like the squared scaled distance ‖τ/ℓ‖²; training follows that noise, drives
lengthscales towards 0 and stops at a loss far above the exact GP's (scikit-learn's raw diabetes, N = 200, F = 256:
2202 per point against 5.80, test RMSE 173 against 76, where the mean predicts with 76; from ℓ = the columns'
standard deviations both reach 5.5, RMSE 56).  Standardised data rarely come close: 10 standard-normal columns are
≈ 6.5 lengthscales apart at ℓ = 0.69; raw co2 or elnino time in years ≈ 20–30, where rfgp trained as the exact GP
(``benchmarks/raw_data_sweep.py``).

A median over all pairs misses many standardised columns: 30 standardised columns of modeldata's ``deliveries``
(hour, distance, weekday and 27 item counts) lie a median of 10.8 lengthscales apart at ℓ = 0.69, but each row's
nearest distinct neighbour a median of 4.5 (k ≈ 3·10⁻⁵ there, far below the estimate's Monte-Carlo error 1/√F), so
the kernel is ≈ 0 between every point and all others.  From there ORF (F = 1024, 2 000 rows) reported convergence at
a loss of 1.40 per point (the white-noise model: test RMSE 6.9 minutes, the targets' spread), where the exact GP
reached 0.35 (RMSE 2.2) and ORF started at ℓ = √d reached 0.24–0.27 (RMSE 1.9–2.2); a Nyström map (M = 512) from
ℓ = 0.69 stopped at the white-noise model too (1.42) (``benchmarks/results/fresh_data_pass.md``).  So
a median nearest-neighbour distance above ``MEDIAN_NEIGHBOUR_DISTANCE`` lengthscales warns too: at 3 the RBF kernel
is e^{−4.5} ≈ 0.011, below 1/√F for every F up to 8 000; standardised diabetes (10 columns, 200 rows: 2.2) and the
time series stay below it, standardised star98 (20 columns, 120 rows: 3.3), where ORF ended at a loss of 1.22
against the exact GP's 0.74, lies above.

Nyström maps (:class:`~rfgp.kernels.NystromKernel`) have no Monte-Carlo noise, but the same start leaves them
useless: K(x, Z) ≈ 0 between every point and every landmark but itself, so Φ(x) = K(x, Z)L⁻ᵀ vanishes away from the
landmarks, the marginal likelihood is flat in the lengthscale and training stays at the white-noise model (the
``deliveries`` pass above).  Both checks therefore also run on each RBF or Matérn kernel in a Nyström kernel's base
tree (through ``ScaleKernel``, sums and products, on the columns it sees), whose correlation at 3 lengthscales is
0.011 (RBF) to 0.05 (Matérn-1/2).  Not on rational-quadratic kernels, whose polynomial tails (1 + r²/2α)^−α keep
0.18 at 3 lengthscales for α = 1, nor on periodic ones, whose lengthscale scales sin(π·(x − x')/p), not the distance.

Both also run on each random Fourier factor of a product kernel (Kronecker, spectral or TensorSRHT, nested ones
included, each on the columns it sees; the message names e.g. ``SketchedMaternKernel (a factor of
SpectralProductKernel)``): the product's correlation is the factor's times the other factors', each at most 1 in size
(Cauchy–Schwarz, a linear factor's too), so a factor ≈ 0 between the points leaves the product ≈ 0 there as well
(R's volcano in metres, 600 cells, Matérn-3/2 × Linear, ORF F = 1 024 from ℓ = 0.69 m: test RMSE 25.3 m, the
targets' spread, unwarned before; standardised coordinates: 2.2 m).

Exact GPyTorch models trained by :func:`rfgp.fit_mll` get the first check too, on each RBF or Matérn kernel of
``model.covar_module`` outside rfgp's kernels: an exact kernel ≈ 0 between almost all training points leaves the
white-noise model (R's volcano elevations on a 10 m grid in metres, 1 000 cells, Matérn-3/2 from ℓ = 0.69 m: test
RMSE 25.9 m, the targets' spread, "converged"; ORF from the same start, warned, reached 1.5 m).  Not the
nearest-neighbour check: from a few lengthscales between neighbours the exact GP still trains (the 30 columns above).

Raw targets can fail the other way: GPyTorch's Gaussian likelihoods keep the noise variance above 10⁻⁴ (2·10⁻⁴ for a
multitask one's global plus independent task noise), so targets that vary less than that — a magnetic field in tesla,
~10⁻⁹ — are explained as noise and the posterior mean stays at the prior mean, while training reports convergence.
:func:`warn_targets_below_noise_floor` says so before the first step.
"""

from __future__ import annotations

import gpytorch
import torch

from ..core.user_warnings import warn as warn_user
from ..kernels.input_columns import children
from ..training import DataScaleWarning, register_start_check
from .feature_width import fourier_units, nystrom_units
from .kernel_inputs import covar_module_inputs

#: warn when the median distance between training points exceeds this many lengthscales
MEDIAN_SCALED_DISTANCE = 50.0
#: warn when a training row's nearest distinct training row lies a median of more than this many lengthscales away
MEDIAN_NEIGHBOUR_DISTANCE = 3.0
#: the lengthscale kernels of a Nyström base tree that are ≈ 0 beyond a few lengthscales (see the module docstring)
_DECAYING = (gpytorch.kernels.RBFKernel, gpytorch.kernels.MaternKernel, gpytorch.kernels.keops.RBFKernel,
             gpytorch.kernels.keops.MaternKernel)
_VANISHING_NYSTROM = ("landmarks included, so the Nyström features K(x, Z)L⁻ᵀ vanish away from the landmarks, the "
                      "marginal likelihood is flat in the lengthscale and training stays at the white-noise model")
#: why a kernel ≈ 0 between the training points leaves each kind of map useless: (apart, from each neighbour)
_CONSEQUENCES = {
    "fourier": ("where its marginal likelihood is flat and the random-feature estimate is Monte-Carlo noise whose "
                "lengthscale gradient grows with the squared distance, so training follows the noise (raw diabetes, "
                "F = 256: loss 2202 per point against the exact GP's 5.8)",
                "below the random-feature estimate's Monte-Carlo error, so training follows that noise to the "
                "white-noise model (30 standardised columns, F = 1024: loss 1.40 per point against the exact GP's "
                "0.35)"),
    "nystrom": (_VANISHING_NYSTROM, _VANISHING_NYSTROM + " (30 standardised columns, M = 512: loss 1.42 per point "
                "against the exact GP's 0.35)"),
    # an exact kernel still trains from a few lengthscales between neighbours (the 30 columns: loss 0.35)
    "exact": ("so its marginal likelihood is flat in the lengthscale and training stays at the white-noise model "
              "(R's volcano elevations on a 10 m grid in metres, 1 000 cells: test RMSE 25.9 m, the targets' spread)",
              None),
}
#: the median is taken over the pairs of at most this many training rows (evenly spaced)
_SAMPLE_ROWS = 256
#: nearest neighbours are searched among at most this many training rows (evenly spaced)
_NEIGHBOUR_ROWS = 8192


def _evenly_spaced_rows(x: torch.Tensor, count: int) -> torch.Tensor:
    rows = x.detach().reshape(-1, x.shape[-1])
    # in float64: float32 (the default dtype) rounded an index past N − 1 from N = 2²⁴ + 4 rows on (an IndexError)
    index = torch.linspace(0, rows.shape[0] - 1, min(rows.shape[0], count), dtype=torch.float64).round().long().unique()
    return rows[index.to(rows.device)].to(torch.float64)  # select first: no float64 copy of all N rows


def _check_lengthscale_columns(x: torch.Tensor, lengthscale: torch.Tensor, what: str = "lengthscale") -> None:
    """Raise ``ValueError`` unless ``lengthscale`` has one entry, or one per column of ``x``, on its last axis.

    The kernel would refuse such inputs itself, but these checks run first (from :func:`rfgp.fit_mll`)."""
    columns, entries = x.shape[-1], lengthscale.shape[-1]
    if entries not in (1, columns):
        raise ValueError(
            f"{what} has {entries} entries (ard_num_dims={entries}) but its inputs have {columns} columns (after "
            f"active_dims); build the kernel with ard_num_dims={columns}, or give it active_dims that select "
            f"{entries} columns"
        )


def _largest_lengthscale(x: torch.Tensor, lengthscale: torch.Tensor) -> torch.Tensor:
    _check_lengthscale_columns(x, lengthscale)
    return lengthscale.detach().to(torch.float64).reshape(-1, lengthscale.shape[-1]).amax(0)


def median_scaled_distance(x: torch.Tensor, lengthscale: torch.Tensor) -> float:
    """The median of ‖(xᵢ − xⱼ)/ℓ‖ over pairs of rows of ``x`` (at most ``_SAMPLE_ROWS`` of them, evenly spaced);
    ``lengthscale`` of shape ``(..., 1, d or 1)``, the largest over a batch (the mildest case) is used; another
    last axis raises ``ValueError``."""
    ell = _largest_lengthscale(x, lengthscale)
    rows = _evenly_spaced_rows(x, _SAMPLE_ROWS)
    if rows.shape[0] < 2:
        return 0.0
    return float(torch.pdist(rows / ell).median())


def median_neighbour_distance(x: torch.Tensor, lengthscale: torch.Tensor) -> float:
    """The median over rows of ``x`` (at most ``_SAMPLE_ROWS``, evenly spaced) of ‖(xᵢ − xⱼ)/ℓ‖ to the nearest row
    xⱼ ≠ xᵢ among at most ``_NEIGHBOUR_ROWS`` (evenly spaced; duplicates of xᵢ are no neighbours: they carry no
    information about ℓ); ``lengthscale`` as for :func:`median_scaled_distance`.  0 when no row has a distinct one."""
    ell = _largest_lengthscale(x, lengthscale)
    reference = _evenly_spaced_rows(x, _NEIGHBOUR_ROWS) / ell
    # without matrix products: a row's distance to itself must come out exactly 0 to be skipped
    distances = torch.cdist(_evenly_spaced_rows(x, _SAMPLE_ROWS) / ell, reference,
                            compute_mode="donot_use_mm_for_euclid_dist")
    nearest = distances.masked_fill(distances == 0, float("inf")).amin(-1)
    nearest = nearest[torch.isfinite(nearest)]
    return float(nearest.median()) if nearest.numel() else 0.0


def shown_lengthscales(kernel) -> str:
    """A kernel's lengthscales for messages: at most 4, then '…'."""
    values = kernel.lengthscale.detach().flatten().tolist()
    return ", ".join(f"{v:.3g}" for v in values[:4]) + (", …" if len(values) > 4 else "")


def decaying_kernels(kernel: gpytorch.kernels.Kernel, x: torch.Tensor) -> list[tuple[gpytorch.kernels.Kernel,
                                                                                   torch.Tensor]]:
    """(kernel, the input columns it sees) for each exact RBF or Matérn kernel in the tree of ``kernel`` called on
    ``x``, through ``ScaleKernel``, sums, products and GPyTorch's structure and multitask nodes (their
    ``active_dims`` applied as GPyTorch evaluates them); rfgp's kernels end the search."""
    found = []
    stack = [(kernel, x, True)]
    while stack:
        kernel, columns, called = stack.pop()
        if called and kernel.active_dims is not None:
            columns = columns.index_select(-1, kernel.active_dims.to(columns.device))
        if isinstance(kernel, _DECAYING):
            found.append((kernel, columns))
        stack.extend((child, columns, child_called) for child, child_called in children(kernel))
    return found


def nystrom_lengthscale_kernels(module, x: torch.Tensor) -> list[tuple[gpytorch.kernels.Kernel, torch.Tensor]]:
    """(kernel, the input columns it sees) for each RBF or Matérn kernel in the base tree of each Nyström kernel in
    ``module`` (:func:`decaying_kernels`; the Nyström kernel calls its base kernel)."""
    return [found for nystrom, inputs in nystrom_units(module, x)
            for found in decaying_kernels(nystrom.base_kernel, inputs)]


def warn_lengthscale_below_data_scale(model: gpytorch.models.ExactGP) -> None:
    """Warn (:class:`~rfgp.training.DataScaleWarning`) for each random Fourier kernel (factors of products included),
    and each RBF or Matérn kernel inside a Nyström kernel, whose training inputs lie a median of more than
    ``MEDIAN_SCALED_DISTANCE`` lengthscales apart, or else a median of more than ``MEDIAN_NEIGHBOUR_DISTANCE``
    lengthscales from their nearest neighbours, and for each exact RBF or Matérn kernel of ``model.covar_module``
    whose inputs lie that far apart (its inputs as ``model.forward`` passes them on, e.g. a deep kernel's network
    outputs: :func:`~rfgp.models.kernel_inputs.covar_module_inputs`)."""
    train_inputs = getattr(model, "train_inputs", None)
    if not train_inputs or not torch.is_tensor(train_inputs[0]) or not train_inputs[0].is_floating_point():
        return
    inputs = covar_module_inputs(model, train_inputs[0])
    checked = [(owner, x, "fourier", f" (a factor of {type(product).__name__})" if product is not None else "")
               for _, owner, x, product in fourier_units(model, inputs)]
    checked += [(kernel, x, "nystrom", " (in a NystromKernel)")
                for kernel, x in nystrom_lengthscale_kernels(model, inputs)]
    covar_module = getattr(model, "covar_module", None)
    if isinstance(covar_module, gpytorch.kernels.Kernel):
        checked += [(kernel, x, "exact", "") for kernel, x in decaying_kernels(covar_module, inputs)]
    for kernel, x, kind, where in checked:
        name = type(kernel).__name__ + where
        apart, from_neighbours = _CONSEQUENCES[kind]
        _check_lengthscale_columns(x, kernel.lengthscale, f"fit_mll: the lengthscale of {name}")
        distance = median_scaled_distance(x, kernel.lengthscale)
        if distance > MEDIAN_SCALED_DISTANCE:
            shown = shown_lengthscales(kernel)
            warn_user(
                f"fit_mll: the training inputs of {name} lie a median {distance:.3g} lengthscales apart (lengthscale "
                f"{shown}; more than {MEDIAN_SCALED_DISTANCE:g}): the kernel is ≈ 0 between almost all of them, "
                f"{apart}. Standardise the inputs, or start from a lengthscale on the data's scale, e.g. "
                "kernel.lengthscale = train_x.std(0)",
                DataScaleWarning,
            )
            continue
        if from_neighbours is None:
            continue
        neighbour = median_neighbour_distance(x, kernel.lengthscale)
        if neighbour > MEDIAN_NEIGHBOUR_DISTANCE:
            shown = shown_lengthscales(kernel)
            warn_user(
                f"fit_mll: each training input of {name} lies a median {neighbour:.3g} lengthscales from its nearest "
                f"neighbour (lengthscale {shown}; more than {MEDIAN_NEIGHBOUR_DISTANCE:g}), as many standardised "
                f"columns put them: the kernel is ≈ 0 between every point and all others, {from_neighbours}. Start "
                "from a lengthscale that reaches the neighbours, e.g. kernel.lengthscale = "
                "math.sqrt(train_x.shape[-1]) * train_x.std(0) (BoTorch's dimension-scaled prior does the same)",
                DataScaleWarning,
            )


register_start_check(warn_lengthscale_below_data_scale)


def noise_floor(likelihood) -> float | None:
    """The smallest noise variance that a likelihood's learned noise can take (``None`` where no learned noise has a
    floor): the sum of the lower bounds of its noise constraints, i.e. GPyTorch's default 10⁻⁴, for a
    ``GaussianLikelihood``, the learned part of a ``FixedNoiseGaussianLikelihood(learn_additional_noise=True)`` (the
    known per-point noise adds to it, and is the data's own), a Gaussian likelihood whose noise is GPyTorch's
    ``HeteroskedasticNoise`` (its noise model's output is kept above the bound) and a
    ``MultitaskGaussianLikelihood``: with independent task noises (rank 0), the global noise's plus each output's own
    (2·10⁻⁴)."""
    noise_covar = getattr(likelihood, "noise_covar", None)
    if type(likelihood) is gpytorch.likelihoods.GaussianLikelihood:
        constraints = [likelihood.noise_covar.raw_noise_constraint]
    elif type(likelihood) is gpytorch.likelihoods.FixedNoiseGaussianLikelihood:
        if likelihood.second_noise_covar is None:
            return None
        constraints = [likelihood.second_noise_covar.raw_noise_constraint]
    elif (isinstance(likelihood, gpytorch.likelihoods._GaussianLikelihoodBase)
          and type(noise_covar) is gpytorch.likelihoods.noise_models.HeteroskedasticNoise):
        constraints = [noise_covar._noise_constraint]
    elif type(likelihood) is gpytorch.likelihoods.MultitaskGaussianLikelihood:
        # one constraint object may guard both noises: named_constraints() would list it once
        constraints = [likelihood._constraints[name] for name in ("raw_noise_constraint", "raw_task_noises_constraint")
                       if name in likelihood._constraints]
    else:
        return None
    return float(sum(constraint.lower_bound.detach().to(torch.float64).max() for constraint in constraints))


def warn_targets_below_noise_floor(model: gpytorch.models.ExactGP) -> None:
    """Warn (:class:`~rfgp.training.DataScaleWarning`) when an output's training targets vary less than the
    likelihood's noise can: with a variance below :func:`noise_floor` the marginal likelihood explains them as noise
    and the posterior mean stays at the prior mean (the IGRF field in tesla, variance 10⁻⁹ against GPyTorch's floor
    2·10⁻⁴: a curl-free GP "converged" with a relative RMSE of 1.0 at the training points).  Variances over the data
    axis (the points of each output of a multitask likelihood, of each member of a batch), NaN targets left out;
    constant targets (variance 0) carry no signal to lose and are not reported.  The message names the outputs or
    batch members concerned."""
    floor = noise_floor(getattr(model, "likelihood", None))
    targets = getattr(model, "train_targets", None)
    if floor is None or not floor > 0 or not torch.is_tensor(targets) or not targets.is_floating_point():
        return
    multitask = isinstance(model.likelihood, gpytorch.likelihoods.MultitaskGaussianLikelihood)
    values = targets.detach().to(torch.float64)
    values = values.movedim(-2, -1) if multitask and values.dim() >= 2 else values  # (..., outputs, points)
    count = (~values.isnan()).sum(-1)
    variance = (values - values.nanmean(-1, keepdim=True)).pow(2).nansum(-1) / (count - 1).clamp_min(1)
    missing = values.isnan()
    spread = values.masked_fill(missing, -torch.inf).amax(-1) - values.masked_fill(missing, torch.inf).amin(-1)
    low = (spread > 0) & (variance < floor)  # spread 0: constant (a variance of rounding errors)
    if not bool(low.any()):
        return
    largest = float(variance[low].max())
    where = ""
    if multitask:
        outputs = low.reshape(-1, low.shape[-1]).any(0).nonzero().flatten().tolist()
        where = f"of output{'s' * (len(outputs) > 1)} {', '.join(map(str, outputs))} "
    elif low.dim():  # a batch of independent GPs (train_y (*batch, N)): which members
        members = [tuple(index) if len(index) > 1 else index[0] for index in low.nonzero().tolist()]
        shown = ", ".join(map(str, members[:5])) + (f" (and {len(members) - 5} more)" if len(members) > 5 else "")
        where = f"of batch member{'s' * (len(members) > 1)} {shown} "
    warn_user(
        f"fit_mll: the training targets {where}vary with a variance of {largest:.3g} or less, below the smallest noise "
        f"variance the likelihood allows ({floor:.3g}, its noise constraints' lower bounds): the marginal likelihood "
        "explains them as noise and the posterior mean stays at the prior mean. Rescale the targets (e.g. "
        "train_y / train_y.std(0), in units where they vary by about 1), or lower the noise constraint's bound",
        DataScaleWarning,
    )


register_start_check(warn_targets_below_noise_floor)
