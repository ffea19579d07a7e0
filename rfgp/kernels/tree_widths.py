"""How :func:`rfgp.sketch` spends a total width F on a kernel tree's sums and products.

* **Sums** split F *equally* among their parts, after the exact finite parts (``is_exact``:
  ``IndexKernel``, Linear, Constant, Cosine features) took their own widths; each random part
  gets an even share (sin/cos maps have F = 2m), the remaining pairs go to the first parts, so
  the total is ≤ F.  Equal rather than proportional to the outputscales: at conversion time
  those are often initial values that training then changes (so widths would depend on an
  arbitrary moment), and a part's need for features depends on its structure (a periodic part
  with many harmonics, a short lengthscale) as much as on its amplitude.  (A Linear part of
  width d unknown at conversion — no ``ard_num_dims``, ``active_dims``, ``input_dim=`` or ``x_sample=`` — is
  not reserved: the total is then ≤ F + d, with a warning.)  Per-part widths are
  given as a list, ``num_features=[256, 512, 256]``, one entry per part of the
  ``AdditiveKernel`` (``ScaleKernel``s looked through); an entry may be a list for a nested sum.
  An ``LCMKernel`` is a sum of ``MultitaskKernel`` s: its data kernels share F the same way, and an
  ``AdditiveStructureKernel`` the sum of its base kernel on each of its d columns
  (:mod:`rfgp.kernels.structure`): each column gets an even share of F (a list gives one width per column).
* **Products** keep F (a ``ProductStructureKernel`` is the product of its base kernel on each column):

  - factors with the spectral protocol (RBF, Matérn, periodic, RQ, …) → one
    :class:`~rfgp.kernels.SpectralProductKernel` (ω = Σωᵢ; one joint frequency vector across
    ``active_dims``; a ``ScaleKernel`` factor folds into the amplitude);
  - other random factors (polynomial, …) → a :class:`~rfgp.kernels.SketchedProductKernel`
    (TensorSRHT of the factors' features, with the spectral group as one factor);
  - exact factors without a spectral form (``IndexKernel``, Linear, BoTorch's ``DownsamplingKernel``) of total
    width w → row-wise Kronecker (:class:`~rfgp.kernels.FeatureProductKernel`) with the random part at the
    even width ≤ F/w (all-exact products: Kronecker when w ≤ F, else TensorSRHT to F); an exact factor whose
    class sets ``kronecker_factor = False`` (the 106 quadrature features of BoTorch's ``ExponentialDecayKernel``)
    joins the random factors' TensorSRHT instead.

  Factors keep the exact tree's order where they can, so the exact tree's ``state_dict``
  (``kernels.i.*``) loads into the converted product.  Where several spectral factors are
  convolved into one (``kernels.0.kernels.j``) or the random part moves before the exact factors,
  the converted product records where each exact factor went (``exact_factor_paths``) and a
  load-state-dict pre-hook (:func:`load_exact_factor_keys`) moves an exact state's keys there.

The builder converts sub-trees through callables, so it does not depend on how leaves are
converted: ``convert(part, width)`` (real seeds), ``probe(part, width)`` (throwaway seeds, to
find the exact parts, which use no randomness) and ``take_seed()``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

from gpytorch.kernels import Kernel

from ..core.user_warnings import warn as warn_user
from .combinations import (
    FeatureProductKernel,
    FeatureSumKernel,
    SketchedProductKernel,
    is_exact_feature_kernel,
    kernel_num_features,
    unwrap_scale,
)
from .spectral_product import SpectralProductKernel, has_spectral_protocol


def leaf_width(num_features, kernel: Kernel) -> int:
    """The width a leaf (or product) gets; refuses a list of per-part widths that reached it."""
    if isinstance(num_features, (list, tuple)):
        raise ValueError(
            f"num_features={list(num_features)} gives per-part widths of an AdditiveKernel, but it reached a "
            f"{type(kernel).__name__}; pass an int there (nested lists follow nested AdditiveKernels)"
        )
    return num_features


def check_width(width, name: str) -> None:
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise ValueError(f"{name}: every width must be a positive int, got {width!r}")


def check_exact_part_width(part: Kernel, exact: Kernel, width: int, given: str) -> None:
    """A ValueError for the conversion ``part`` of ``exact``, a part of a sum, that has exact features (``is_exact``:
    Linear, Index, Constant, Cosine) wider than the ``width`` given to it: they cannot be cut, so the sum would exceed
    the widths asked for.  (Exact factors of a product are not checked: it sketches them to F.)"""
    needed = exact_width(part) if is_exact_feature_kernel(part) else 0
    if needed > width:
        raise ValueError(
            f"{given}: {type(unwrap_scale(exact)[0]).__name__} has exactly {needed} features (exact features cannot be "
            f"fewer), more than the {width} given to it; accepted: a width ≥ {needed} for it"
        )


def is_kronecker_factor(kernel: Kernel) -> bool:
    """An exact factor with no spectral form to convolve instead (IndexKernel, Linear), unless its class says that its
    width is too large to multiply a product's by (``kronecker_factor = False``: it joins the TensorSRHT instead)."""
    base = unwrap_scale(kernel)[0]
    return is_exact_feature_kernel(kernel) and not has_spectral_protocol(kernel) and getattr(base, "kronecker_factor",
                                                                                             True)


def exact_width(kernel: Kernel) -> int:
    """The width of an exact part; 0 for a Linear kernel whose input dimension d is still unknown.

    A Linear kernel's width d is known from ``ard_num_dims``, ``active_dims`` or the converter's
    ``input_dim=`` option; without them it is set at the first call, so the sum cannot reserve it
    and the converted tree is at most F + d wide (pass one of them to keep it within F).
    """
    try:
        return kernel_num_features(kernel)
    except RuntimeError:
        return 0 if kernel.active_dims is None else len(kernel.active_dims)


class TreeBuilder:
    """Builds the width-F feature kernels of ``AdditiveKernel``/``ProductKernel`` nodes (see module doc)."""

    def __init__(self, convert: Callable[[Kernel, int], Kernel], probe: Callable[[Kernel, int], Kernel],
                 take_seed: Callable[[], int | None]) -> None:
        self.convert = convert
        self.probe = probe
        self.take_seed = take_seed

    def _probes(self, parts, num_features: int) -> list[Kernel]:
        even = max(num_features - num_features % 2, 2)
        return [self.probe(part, even) for part in parts]

    # --------------------------------------------------------------------- sums
    def sum(self, kernel: Kernel, num_features) -> FeatureSumKernel:
        return FeatureSumKernel(*self.sum_parts(kernel.kernels, num_features, "AdditiveKernel"),
                                active_dims=kernel.active_dims)

    def sum_parts(self, parts, num_features, owner: str) -> list[Kernel]:
        """The converted parts of a sum (``owner`` names it in errors): widths as given per part, or F split."""
        if isinstance(num_features, (list, tuple)):
            if len(num_features) != len(parts):
                raise ValueError(
                    f"num_features={list(num_features)} has {len(num_features)} widths but the {owner} has "
                    f"{len(parts)} parts ({', '.join(type(p).__name__ for p in parts)})"
                )
            for width in num_features:
                if not isinstance(width, (list, tuple)):
                    check_width(width, f"num_features={list(num_features)}")
            converted = [self.convert(part, width) for part, width in zip(parts, num_features)]
            for part, exact, width in zip(converted, parts, num_features):
                if not isinstance(width, (list, tuple)):
                    check_exact_part_width(part, exact, width, f"num_features={list(num_features)}")
            return converted
        return self._split(parts, num_features, owner)

    def _split(self, parts, num_features: int, owner: str) -> list[Kernel]:
        check_width(num_features, "num_features")
        probes = self._probes(parts, num_features)
        unknown = [type(unwrap_scale(p)[0]).__name__ for p in probes
                   if is_exact_feature_kernel(p) and not exact_width(p)]
        if unknown:
            warn_user(
                f"num_features={num_features}: the width d of {unknown[0]} (its input dimension) is unknown at "
                f"conversion, so this {owner} is up to {num_features} + d wide after its first call, not "
                f"{num_features}: give the exact kernel ard_num_dims= or active_dims=, or pass input_dim= or x_sample= "
                "to rfgp.sketch"
            )
        reserved = sum(exact_width(p) for p in probes if is_exact_feature_kernel(p))
        num_random = sum(not is_exact_feature_kernel(p) for p in probes)
        remaining = num_features - reserved
        share = 2 * (remaining // (2 * num_random)) if num_random else 0
        if reserved > num_features or (num_random and share < 2):
            raise ValueError(
                f"num_features={num_features} is too small for this {owner}: its exact parts take "
                f"{reserved} features and its {num_random} random parts need at least 2 each"
            )
        pairs_left = (remaining - share * num_random) // 2  # one more pair each for the first random parts
        converted = []
        for part, probe in zip(parts, probes):
            if is_exact_feature_kernel(probe):
                converted.append(probe)
                continue
            converted.append(self.convert(part, share + 2 * (pairs_left > 0)))
            pairs_left -= 1
        return converted

    # ----------------------------------------------------------------- products
    def product(self, kernel: Kernel, num_features) -> Kernel:
        num_features = leaf_width(num_features, kernel)
        check_width(num_features, "num_features")
        num_features -= num_features % 2 if num_features > 1 else 0  # sin/cos maps come in pairs
        probes = self._probes(kernel.kernels, num_features)
        exact = [p for p in probes if is_kronecker_factor(p)]
        unknown = [type(p).__name__ for p in exact if exact_width(p) == 0]
        if unknown:
            raise ValueError(
                f"the width of {unknown[0]} (its input dimension) is unknown at conversion, so this ProductKernel "
                "cannot keep its width F: give the exact kernel ard_num_dims= or active_dims=, or pass input_dim= or "
                "x_sample= (points of the input space) to rfgp.sketch"
            )
        width_of_exact = math.prod(exact_width(p) for p in exact)
        if len(exact) == len(probes):
            if width_of_exact <= num_features:
                return FeatureProductKernel(*exact, active_dims=kernel.active_dims)
            return SketchedProductKernel(*exact, num_features=num_features, seed=self.take_seed(),
                                         active_dims=kernel.active_dims)
        random_width = 2 * (num_features // width_of_exact // 2)
        if random_width < 2:
            raise ValueError(
                f"num_features={num_features} is too small for this ProductKernel: its exact factors have "
                f"{width_of_exact} features, so its random factors would get fewer than 2"
            )
        factors = [self.convert(part, random_width)
                   for part, probe in zip(kernel.kernels, probes) if not is_kronecker_factor(probe)]
        random, random_paths = self._random_product(factors, random_width,
                                                    {} if exact else {"active_dims": kernel.active_dims})
        if not exact:
            return _with_exact_factor_paths(random, random_paths)
        if len(factors) == 1:  # the exact tree's factor order, so that its state_dict keys (kernels.i.*) carry over
            ordered = [probe if is_kronecker_factor(probe) else random for probe in probes]
            return FeatureProductKernel(*ordered, active_dims=kernel.active_dims)
        random_paths, exact_positions = iter(random_paths), iter(range(1, len(exact) + 1))
        paths = [f"kernels.{next(exact_positions)}" if is_kronecker_factor(probe) else f"kernels.0.{next(random_paths)}"
                 for probe in probes]
        return _with_exact_factor_paths(FeatureProductKernel(random, *exact, active_dims=kernel.active_dims), paths)

    def _random_product(self, factors: list[Kernel], num_features: int, outer: dict) -> tuple[Kernel, list[str]]:
        """Spectral factors convolved into one, the rest TensorSRHT-combined; ``outer`` (dims) on the result.

        Returns the kernel and, for each factor in order, its module path in that kernel.
        """
        spectral = [f for f in factors if has_spectral_protocol(f)]
        others = [f for f in factors if not has_spectral_protocol(f)]
        in_order = [f"kernels.{i}" for i in range(len(factors))]
        if len(spectral) > 1 and not others:
            return SpectralProductKernel(*spectral, num_features=num_features, seed=self.take_seed(), **outer), in_order
        if len(factors) > 1:
            paths = in_order  # the exact tree's order, so that its state_dict keys (kernels.i.*) carry over
            if len(spectral) > 1:
                group = iter(range(len(spectral)))
                rest = iter(range(1, len(others) + 1))
                paths = [f"kernels.0.kernels.{next(group)}" if has_spectral_protocol(f) else f"kernels.{next(rest)}"
                         for f in factors]
                spectral = [SpectralProductKernel(*spectral, num_features=num_features, seed=self.take_seed())]
                factors = [*spectral, *others]
            return SketchedProductKernel(*factors, num_features=num_features, seed=self.take_seed(), **outer), paths
        if not outer or outer["active_dims"] is None:
            return factors[0], [""]
        return FeatureProductKernel(factors[0], **outer), ["kernels.0"]  # a one-factor product under its own dims


def _with_exact_factor_paths(product: Kernel, paths: list[str]) -> Kernel:
    """Record where the exact tree's factor i went (``paths[i]``) when the order changed, with the loading hook."""
    if paths != [f"kernels.{i}" for i in range(len(paths))]:  # [""]: a one-factor product became its factor
        product.exact_factor_paths = tuple(paths)
        product.register_load_state_dict_pre_hook(functools.partial(load_exact_factor_keys, tuple(paths)))
    return product


def load_exact_factor_keys(paths: tuple[str, ...], module: Kernel, state_dict: dict, prefix: str, *args) -> None:
    """Move an exact product's keys ``kernels.i.*`` to ``paths[i].*`` when that is the layout they fit.

    The state is the exact tree's when more of its keys under ``prefix`` are keys of the converted
    product after the move than before it (a converted product's own state fits as it is).
    """
    own = {prefix + key for key in module.state_dict()}

    def moved(key: str) -> str:
        head, _, rest = key[len(prefix):].partition(".")
        index, _, tail = rest.partition(".")
        if head != "kernels" or not index.isdigit() or int(index) >= len(paths):
            return key
        return prefix + ".".join(part for part in (paths[int(index)], tail) if part)

    keys = [key for key in state_dict if key.startswith(prefix)]
    if sum(moved(key) in own for key in keys) > sum(key in own for key in keys):
        # all at once: a factor's destination can be another factor's source (kernels.0 -> kernels.1 while
        # kernels.1 -> kernels.0.kernels.0), which moving key by key would overwrite before it is moved
        values = {moved(key): state_dict.pop(key) for key in keys}
        state_dict.update(values)
