"""What ``rfgp.sketch`` carries from a kernel beyond its type's hyperparameters, and the check that no prior is lost.

A kernel instance can hold parameters and priors its class does not define: BoTorch's ``add_saas_prior`` (MAP-SAAS
models, ``get_map_saas_model``) registers on a Matérn kernel a global shrinkage τ (``raw_tau`` with its constraint)
and the priors τ ~ HC(0.1) (``tau_prior``) and τ/ℓ² ~ HC(1) (``inv_lengthscale_prior``).  They cannot change the
covariance — the class's ``forward`` does not read them — but they are part of the model: the MAP objective of
``ExactMarginalLogLikelihood`` is log p(y | θ) + Σᵢ log pᵢ(gᵢ(θ)), each prior pᵢ evaluated at its closure gᵢ of the
kernel module.  :func:`carry_extra_hyperparameters` gives a converted kernel the same extra parameters (values and
constraints) and priors (closures included: they read hyperparameters by name, and the converted kernel has the
same ones); :func:`check_priors_kept` compares the two trees' prior terms, so that a prior that does not carry
over — its closure reads what only the exact kernel has, such as its covariance — raises instead of silently
changing the model.
"""

from __future__ import annotations

import contextlib

import torch
from gpytorch.kernels import Kernel

from ..core.validation import has_values


def carry_extra_hyperparameters(source: Kernel, target: Kernel) -> Kernel:
    """Give ``target`` the parameters (with constraints) and priors of ``source`` itself that it lacks by name.

    ``source``'s own ones only (not its children's: the conversion handles those where it converts them).
    Values are copied, constraints and priors (with their closures) passed on, as for the hyperparameters that the
    converters copy (:func:`rfgp.sketch` then gives the converted tree its own copies of those modules).
    """
    for name, parameter in source.named_parameters(recurse=False):
        if name in target._parameters or hasattr(target, name):
            continue
        target.register_parameter(name, torch.nn.Parameter(parameter.detach().clone(), parameter.requires_grad))
        constraint = source._constraints.get(f"{name}_constraint")
        if constraint is not None:
            target.register_constraint(name, constraint)
            getattr(target, name).data.copy_(parameter.data)  # GPyTorch re-initialises to the constraint's value
    for name, (prior, closure, setting_closure) in source._priors.items():
        if name not in target._priors:
            target._priors[name] = (prior, closure, setting_closure)
            target.add_module(name, prior)
    return target


#: the shifts of every raw hyperparameter at which :func:`check_priors_kept` compares the prior terms
_SHIFTS = (0.0, 0.5)


def check_priors_kept(source: Kernel, converted: Kernel) -> None:
    """Raise a ``TypeError`` unless ``converted`` has ``source``'s prior terms: as many priors and each log pᵢ(gᵢ(θ))
    equal, compared as sorted values since a conversion may restructure the tree and rename modules (a term that
    cannot be evaluated on the exact tree either, e.g. a prior outside its support, only has to exist).

    The terms are compared at the hyperparameters θ and at θ + 1/2 (every raw parameter of each tree shifted in turn,
    by swapping its ``.data``, and restored), so that a closure that only agrees at θ — a ``lengthscale_prior`` on
    ℓ² where ℓ = 1, a closure that reads the exact kernel instead of the module it is given — is refused too.
    Trees on ``meta`` (shape inference) have no values: only the number of terms is compared there."""
    for shift in _SHIFTS:
        with _shifted(source, shift):
            expected = _prior_terms(source)
        with _shifted(converted, shift):
            actual = _prior_terms(converted)
        if _same_terms(expected, actual):
            continue
        lost = [f"{name} ({_describe(actual.get(name))})" for name, value in expected.items()
                if name not in actual or (isinstance(value, torch.Tensor) and not _same_term(value, actual[name]))]
        added = [name for name in actual if name not in expected]
        raise TypeError(
            f"rfgp.sketch would change the model's priors: the exact tree has {len(expected)} prior term(s), the "
            f"converted one {len(actual)}; not kept"
            + (f" (at every raw hyperparameter + {shift})" if shift else "")
            + f": {', '.join(lost) or 'none by name'}"
            + (f"; only in the converted tree: {', '.join(added)}" if added else "")
            + ". A prior whose closure reads more than the kernel's hyperparameters (its covariance, an attribute of "
            "the exact class, another kernel than the module it is given) cannot carry over, nor a prior on a "
            "function of a hyperparameter registered under the hyperparameter's own prior name (lengthscale_prior "
            "on ℓ², which the converted kernel puts on ℓ): remove it, register it under another name (carried over "
            "with its closure), or register a converter with rfgp.register_converter"
        )


@contextlib.contextmanager
def _shifted(module: torch.nn.Module, shift: float):
    """Every parameter of ``module`` shifted by ``shift`` within the block (its ``.data`` swapped, then restored)."""
    saved = [(parameter, parameter.data) for parameter in module.parameters()]
    try:
        with torch.no_grad():
            for parameter, data in saved:
                parameter.data = data + shift
        yield
    finally:
        for parameter, data in saved:
            parameter.data = data


def _prior_terms(kernel: Kernel) -> dict:
    """{name: log pᵢ(gᵢ(θ)) summed, or the exception its closure raised}."""
    terms = {}
    with torch.no_grad():
        for name, module, prior, closure, _ in kernel.named_priors():
            try:
                terms[name] = prior.log_prob(closure(module)).sum()
            except Exception as error:  # reported by name, with the error
                terms[name] = error
    return terms


def _same_terms(expected: dict, actual: dict) -> bool:
    """As many terms, and the same sorted values where the terms have values (not on ``meta``)."""
    if len(expected) != len(actual):
        return False
    if not all(_has_value(term) for term in (*expected.values(), *actual.values())):
        return True
    values, other_values = _values(expected), _values(actual)
    return values.shape == other_values.shape and torch.allclose(values, other_values, equal_nan=True)


def _has_value(term) -> bool:
    return not isinstance(term, torch.Tensor) or has_values(term)


def _values(terms: dict) -> torch.Tensor:
    """The evaluated terms, sorted (NaN last), in float64 on the CPU so that trees on different devices compare."""
    values = [value.detach().to("cpu", torch.float64) for value in terms.values() if isinstance(value, torch.Tensor)]
    return torch.sort(torch.stack(values)).values if values else torch.zeros(0, dtype=torch.float64)


def _same_term(value, other) -> bool:
    if not (_has_value(value) and _has_value(other)):  # meta: present is all that can be compared
        return isinstance(value, torch.Tensor) and isinstance(other, torch.Tensor)
    return isinstance(value, torch.Tensor) and isinstance(other, torch.Tensor) and torch.allclose(
        value.to("cpu", torch.float64), other.to("cpu", torch.float64), equal_nan=True)


def _describe(term) -> str:
    if term is None:
        return "missing"
    if isinstance(term, torch.Tensor):
        return f"log-density {float(term):.6g} differs"
    return f"its closure fails on the converted kernel: {type(term).__name__}: {term}"
