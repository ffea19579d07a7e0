"""rfgp.sketch on seeded random kernel trees (a deterministic slice of a kernel-tree fuzz): sums, products and
nested ScaleKernels of RBF, Matérn, RQ, periodic, cosine, linear, polynomial, spectral-mixture and constant
leaves, with unsorted active_dims, ARD, batch shapes, priors, constraints, fixed and shared hyperparameters.

Each tree must convert to the same parameters (names, values, ``requires_grad``, ties), take a perturbed exact
state as a fresh conversion of the perturbed tree computes it, and round-trip through ``state_dict`` and pickle.
The fuzz found, on such trees, a state-dict hook that swapped factors' hyperparameters, fixed hyperparameters made
trainable, shared modules untied and a product of cosines converted to another kernel.
"""

import pickle
import random

import pytest
import torch
from gpytorch import kernels as K
from gpytorch.constraints import GreaterThan, Interval
from gpytorch.priors import GammaPrior

import rfgp


def _leaf(rng: random.Random, columns: int, batch: torch.Size, pool: list):
    if pool and rng.random() < 0.15:
        return rng.choice(pool)  # the same module twice in the tree
    dims = None
    if columns > 1 and rng.random() < 0.4:
        dims = rng.sample(range(columns), rng.randint(1, columns))  # unsorted
    seen = len(dims) if dims else columns
    ard = {"ard_num_dims": seen} if rng.random() < 0.5 else {}
    common = {"active_dims": dims, "batch_shape": batch if rng.random() < 0.5 else torch.Size()}
    lengthscale = {**ard, "lengthscale_prior": GammaPrior(3.0, 6.0)} if rng.random() < 0.3 else dict(ard)
    if rng.random() < 0.3:
        lengthscale["lengthscale_constraint"] = Interval(0.05, 20.0)
    kinds = ["rbf", "matern", "rq", "periodic", "linear", "polynomial", "mixture", "constant"]
    kind = rng.choice(kinds + (["cosine"] * 2 if seen == 1 else []))
    if kind == "rbf":
        leaf = K.RBFKernel(**common, **lengthscale)
    elif kind == "matern":
        leaf = K.MaternKernel(nu=rng.choice([0.5, 1.5, 2.5]), **common, **lengthscale)
    elif kind == "rq":
        leaf = K.RQKernel(**common, **lengthscale)
    elif kind == "periodic":
        leaf = K.PeriodicKernel(**common, **lengthscale)
    elif kind == "linear":
        leaf = K.LinearKernel(ard_num_dims=seen, **common)
    elif kind == "polynomial":
        leaf = K.PolynomialKernel(power=rng.choice([1, 2, 3]), **common)
    elif kind == "mixture":
        leaf = K.SpectralMixtureKernel(num_mixtures=2, ard_num_dims=seen, **common)
    elif kind == "constant":
        leaf = K.ConstantKernel(**common)
    else:
        leaf = K.CosineKernel(**common)
    if rng.random() < 0.15:
        next(leaf.parameters()).requires_grad_(False)  # a fixed hyperparameter
    pool.append(leaf)
    return leaf


def _tree(rng: random.Random, columns: int, batch: torch.Size, pool: list, depth: int = 0):
    choice = rng.random()
    if depth >= 2 or choice < 0.3:
        node = _leaf(rng, columns, batch, pool)
    elif choice < 0.5:
        node = K.ScaleKernel(_tree(rng, columns, batch, pool, depth + 1), outputscale_constraint=GreaterThan(1e-3))
    else:
        parts = [_tree(rng, columns, batch, pool, depth + 1) for _ in range(rng.choice([2, 3]))]
        node = (K.AdditiveKernel if choice < 0.75 else K.ProductKernel)(*parts)
    return node


def _random_tree(seed: int):
    rng = random.Random(seed)
    columns = rng.randint(1, 4)
    batch = torch.Size([2]) if rng.random() < 0.3 else torch.Size()
    tree = _tree(rng, columns, batch, []).double()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # non-default values
        for parameter in tree.parameters():
            parameter.add_(0.5 * torch.rand(parameter.shape, generator=generator, dtype=parameter.dtype) - 0.2)
    return tree, columns


SEEDS = [3, 7, 12, 20, 33, 46, 68, 78]


@pytest.mark.parametrize("seed", SEEDS)
def test_a_random_tree_keeps_its_parameters_and_state(seed):
    exact, columns = _random_tree(seed)
    x = torch.rand(9, columns, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    sketched = rfgp.sketch(exact, num_features=64, seed=0)
    # the same parameters: as many (ties kept), each fixed one fixed
    assert len(list(sketched.parameters())) == len(list(exact.parameters()))
    assert sum(p.requires_grad for p in sketched.parameters()) == sum(p.requires_grad for p in exact.parameters())
    assert rfgp.sketch(exact, num_features=64, seed=1)(x).to_dense().shape == exact(x).to_dense().shape
    # a perturbed exact state loads as the perturbed tree converts (same seed; both drawn at the new values, since
    # importance-weighted maps fix their proposal at their first call)
    with torch.no_grad():
        for parameter in exact.parameters():
            parameter.add_(0.3)
    result = sketched.load_state_dict(exact.state_dict(), strict=False)
    assert result.unexpected_keys == []
    fresh = rfgp.sketch(exact, num_features=64, seed=0)
    with torch.no_grad():
        torch.testing.assert_close(sketched(x).to_dense(), fresh(x).to_dense(), rtol=1e-10, atol=1e-12)
        # a converted state round-trips bit for bit, and so does pickle
        again = rfgp.sketch(exact, num_features=64, seed=5)
        again.load_state_dict(sketched.state_dict())
        gram = sketched(x).to_dense()
        assert torch.equal(again(x).to_dense(), gram)
        assert torch.equal(pickle.loads(pickle.dumps(sketched))(x).to_dense(), gram)
