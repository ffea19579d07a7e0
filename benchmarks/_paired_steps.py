"""Two implementations of one training step timed alternately in one process (shared by the paired benchmarks).

A step is ``zero_grad`` + loss + ``backward`` of GPyTorch's SVGP (``VariationalELBO``, M learnt inducing points) or
ExactGP (``ExactMarginalLogLikelihood``, the loss ``rfgp.fit_mll`` minimises) model, written as a GPyTorch user writes
them (``tests/_models``).  The implementations alternate after one untimed step each, so a shared host's load hits
them alike; each benchmark records ``os.getloadavg()`` with its rows.
"""

from __future__ import annotations

import os
import sys
import time

import gpytorch

sys.path.append(os.path.join(os.path.dirname(__file__), "..", "tests"))  # last: tests/packaging is no packaging
from _models import UserGP, UserSVGP  # noqa: E402  (the models a GPyTorch user writes)


def svgp_loss(kernel, x, y, num_inducing=64):
    """(model, loss) of GPyTorch's SVGP tutorial model on (x, y), the first ``num_inducing`` rows as inducing points."""
    model = UserSVGP(kernel, x[:num_inducing].clone()).to(x.dtype)
    likelihood = gpytorch.likelihoods.GaussianLikelihood().to(x.dtype)
    mll = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=x.shape[0])
    model.train()
    likelihood.train()
    return model, lambda: -mll(model(x), y)


def exact_loss(kernel, x, y):
    """(model, loss) of a user's ExactGP on (x, y)."""
    model = UserGP(x, y, kernel).to(x.dtype)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    model.train()
    return model, lambda: -mll(model(x), y)


def paired_times(make_loss, repeats, use, implementations, default):
    """({implementation: [seconds]}, {implementation: [loss, *gradients]} of its last step) for zero_grad + loss +
    backward, switching with ``use(name)`` before each step; ``use(default)`` at the end."""
    model, loss = make_loss()
    outputs = {}

    def step(name):
        use(name)
        model.zero_grad()
        start = time.perf_counter()
        value = loss()
        value.backward()
        elapsed = time.perf_counter() - start
        outputs[name] = [value.detach()] + [p.grad.clone() for p in model.parameters() if p.grad is not None]
        return elapsed

    times = {name: [] for name in implementations}
    for name in implementations:
        step(name)
    for _ in range(repeats):
        for name in implementations:
            times[name].append(step(name))
    use(default)
    return times, outputs
