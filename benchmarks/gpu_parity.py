"""CUDA parity: every user workflow of rfgp run on the CPU and on a GPU from the same model, compared number by number.

Each case builds its model on the CPU with fixed seeds, calls it once there (a lazily evaluated kernel still draws
at its first evaluation, on the device, from a seeded CPU generator: the same draws on both), then deep-copies it
to each device and runs the same work there: negative marginal log
likelihood and its gradients, a few ``rfgp.fit_mll`` L-BFGS steps, predictive means and variances, and the
workflow's own calls (BoTorch acquisition values and gradients, streaming updates, a classifier's probabilities, ...).
The GPU's results are compared with the CPU's (float64: relative error of each output against its scale); cases
whose randomness is drawn on the device (Monte-Carlo, Pyro SVI) check device, shape and finiteness only.

Host synchronisations (``torch.cuda.set_sync_debug_mode``) are counted during one no-grad prediction and during one
MLL forward + backward of each case, with the rfgp frame that caused each, so that a host round-trip in a forward
path is visible.  A timing section compares one MLL + gradient and one prediction on the GPU with the CPU and with
GPyTorch's exact GP on the GPU.

    python benchmarks/gpu_parity.py            # on a machine with CUDA; writes benchmarks/results/gpu_parity.md
    python benchmarks/gpu_parity.py --device cpu --out /tmp/parity.md   # the harness itself, CPU against CPU
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import sys
import time
import traceback
import warnings
from collections import Counter

import gpytorch
import torch
from gpytorch.kernels import (
    MaternKernel,
    PeriodicKernel,
    PolynomialKernel,
    RBFKernel,
    RBFKernelGrad,
    RQKernel,
    ScaleKernel,
)

sys.path.append(os.path.join(os.path.dirname(__file__), "..", "tests"))  # last: tests/packaging is no packaging
from _models import BatchIndependentGP, MultitaskGP, UserGP, vector_field_kernel  # noqa: E402

import rfgp  # noqa: E402

DTYPE = torch.float64


def data(n, d, seed=0, outputs=None, test=64):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(n, d, generator=gen, dtype=DTYPE) * 4 - 2
    f = torch.sin(2 * x).sum(-1) + 0.3 * torch.cos(3 * x[:, 0])
    y = f if outputs is None else torch.stack([f * (k + 1) / outputs + 0.2 * k for k in range(outputs)], -1)
    y = y + 0.1 * torch.randn(y.shape, generator=gen, dtype=DTYPE)
    xs = torch.rand(test, d, generator=gen, dtype=DTYPE) * 4 - 2
    return x, y, xs


def materialise(model, x):
    """One training-mode call on the CPU (GPyTorch keeps the covariance lazy: draws may still be made on the device)."""
    model.train()
    with torch.no_grad():
        model(x)


def loss_and_grads(model):
    model.train()
    model.zero_grad()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    loss = -mll(model(*model.train_inputs), model.train_targets)
    loss = loss.sum()
    loss.backward()
    out = {"loss": loss.detach()}
    for name, p in model.named_parameters():
        if p.grad is not None:
            out[f"grad:{name}"] = p.grad.detach().clone()
    return out


def predict(model, xs, likelihood=True):
    model.eval()
    with torch.no_grad():
        f = model(xs)
        pred = model.likelihood(f) if likelihood else f
        return {"mean": pred.mean, "variance": pred.variance}


def gp_work(model, xs, fit_steps=4):
    out = loss_and_grads(model)
    rfgp.fit_mll(model, num_iterations=fit_steps, progress=False)
    out.update({f"trained:{n}": p.detach().clone() for n, p in model.named_parameters()})
    out.update(predict(model, xs))
    return out


# --------------------------------------------------------------------------------------------------- cases
# A case: build() -> (model, x_for_materialise, extra) on the CPU; work(model, extra, device) -> dict of outputs.

def regression_case(kernel_fn, n, d=3, width=512, **sketch_options):
    def build():
        x, y, xs = data(n, d)
        kernel = rfgp.sketch(kernel_fn(d), width, seed=0, **sketch_options)
        model = UserGP(x, y, kernel).to(DTYPE)
        return model, x, {"xs": xs}

    def work(model, extra, device):
        return gp_work(model, extra["xs"].to(device))

    return build, work


def chunked_case():
    build, _ = regression_case(lambda d: ScaleKernel(RBFKernel(ard_num_dims=d)), 3000, width=256, method="orf")

    def work(model, extra, device):
        with rfgp.settings.memory_budget(2**20):  # 1 MiB: many blocks of rows
            return gp_work(model, extra["xs"].to(device), fit_steps=2)

    return build, work


def derivative_case():
    class GradGP(gpytorch.models.ExactGP):
        def __init__(self, x, y, kernel):
            super().__init__(x, y, gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=3))
            self.mean_module = gpytorch.means.ConstantMeanGrad()
            self.covar_module = kernel

        def forward(self, x):
            return gpytorch.distributions.MultitaskMultivariateNormal(self.mean_module(x), self.covar_module(x))

    def build():
        x, _, xs = data(200, 2)
        y = torch.stack([torch.sin(2 * x).sum(-1), 2 * torch.cos(2 * x[:, 0]), 2 * torch.cos(2 * x[:, 1])], -1)
        model = GradGP(x, y, rfgp.sketch(ScaleKernel(RBFKernelGrad(ard_num_dims=2)), 512, seed=0)).to(DTYPE)
        return model, x, {"xs": xs}

    def work(model, extra, device):
        return gp_work(model, extra["xs"].to(device), fit_steps=2)

    return build, work


def vector_field_case(kind, rank=0):
    def build():
        x, y, xs = data(300, 2, outputs=2)
        likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=2, rank=rank)
        model = rfgp.models.MultiOutputGPModel(x, y, likelihood, vector_field_kernel(kind, 256)).to(DTYPE)
        return model, x, {"xs": xs}

    def work(model, extra, device):
        return gp_work(model, extra["xs"].to(device), fit_steps=2)

    return build, work


def batch_independent_case():
    def build():
        x, y, xs = data(400, 2, outputs=2)
        batch = torch.Size([2])
        kernel = rfgp.sketch(ScaleKernel(RBFKernel(batch_shape=batch), batch_shape=batch), 256, seed=0)
        likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=2)
        return BatchIndependentGP(x, y, kernel, likelihood).to(DTYPE), x, {"xs": xs}

    def work(model, extra, device):
        return gp_work(model, extra["xs"].to(device), fit_steps=2)

    return build, work


def set_num_features_case():
    build, _ = regression_case(lambda d: ScaleKernel(RBFKernel(ard_num_dims=d)), 1500, width=128, method="orf")

    def work(model, extra, device):
        out = gp_work(model, extra["xs"].to(device), fit_steps=3)
        rfgp.set_num_features(model, 1024)  # draws at the new width: on the device, so compare loosely below
        after = predict(model, extra["xs"].to(device))
        return {**out, "wide:mean": after["mean"], "wide:variance": after["variance"]}

    return build, work


def streaming_case():
    def build():
        x, y, xs = data(2000, 2)
        kernel = ScaleKernel(rfgp.kernels.SketchedRBFKernel(256, seed=0))
        gp = rfgp.StreamingFeatureGP(kernel, gpytorch.likelihoods.GaussianLikelihood(),
                                     gpytorch.means.ConstantMean()).to(DTYPE)
        return gp, None, {"x": x, "y": y, "xs": xs}

    def work(gp, extra, device):
        x, y = extra["x"].to(device), extra["y"].to(device)
        for rows in torch.arange(x.shape[0], device=device).split(500):
            gp.update(x[rows], y[rows])
        with torch.no_grad():
            pred = gp.likelihood(gp(extra["xs"].to(device)))
        return {"mean": pred.mean, "variance": pred.variance}

    return build, work


def botorch_case():
    from botorch.acquisition import qLogExpectedImprovement
    from botorch.models import SingleTaskGP
    from botorch.sampling import SobolQMCNormalSampler

    def build():
        x, y, xs = data(300, 3)
        model = SingleTaskGP(x, y.unsqueeze(-1))
        model.covar_module = rfgp.sketch(model.covar_module, 1024, seed=0)
        return model, x, {"xs": xs}

    def work(model, extra, device):
        out = loss_and_grads(model)
        model.eval()
        acq = qLogExpectedImprovement(model, best_f=model.train_targets.max(),
                                      sampler=SobolQMCNormalSampler(torch.Size([64]), seed=0))
        X = extra["xs"].to(device)[:24].reshape(8, 3, 3).clone().requires_grad_(True)
        value = acq(X)
        value.sum().backward()
        post = model.posterior(extra["xs"].to(device))
        return {**out, "acq": value.detach(), "acq_grad": X.grad, "post_mean": post.mean, "post_var": post.variance}

    return build, work


def classifier_case():
    from rfgp.models import DirichletGPClassifier

    def build():
        x, _, xs = data(1500, 2)
        labels = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
        return None, None, {"x": x, "labels": labels, "xs": xs}

    def work(_, extra, device):
        classifier = DirichletGPClassifier(num_features=512, num_iterations=20, probability_method="mean_field",
                                           dtype=DTYPE, device=device, seed=0, progress=False)
        classifier.fit(extra["x"], extra["labels"])
        return {"redrawn:probabilities": torch.as_tensor(classifier.predict_proba(extra["xs"]))}

    return build, work


def pyro_case():
    import pyro
    import pyro.distributions as dist

    from rfgp.features import RandomFourierFeatures
    from rfgp.pyro import Gaussian, RandomFeatureGP, fit_svi, posterior_predictive, weight_guide

    def build():
        x, y, xs = data(1000, 2)
        model = RandomFeatureGP(RandomFourierFeatures(256, input_dim=2, seed=0), Gaussian(),
                                lengthscale=dist.Gamma(4.0, 4.0)).to(DTYPE)
        return model, None, {"x": x, "y": y, "xs": xs}

    def work(model, extra, device):
        pyro.clear_param_store()
        pyro.set_rng_seed(0)
        guide = weight_guide(model, family="mean_field", hyperparameters="map")
        fit_svi(model, guide, extra["x"], extra["y"], num_steps=200, lr=0.05, progress=False)
        samples = posterior_predictive(model, extra["xs"], guide, num_samples=200)
        return {"redrawn:f_mean": samples["f"].mean(0)}

    return build, work


def multitask_kronecker_case(noise_rank, budget=None):
    """GPyTorch's multitask tutorial model: statistics from the Kronecker factors, φ whole or, under a ``budget`` (in
    bytes) it exceeds, in row blocks."""
    def build():
        x, y, xs = data(1000, 2, outputs=3)
        kernel = rfgp.sketch(gpytorch.kernels.MultitaskKernel(RBFKernel(), num_tasks=3, rank=1), 512, seed=0)
        likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=3, rank=noise_rank)
        return MultitaskGP(x, y, likelihood, kernel).to(DTYPE), x, {"xs": xs}

    def work(model, extra, device):
        with rfgp.settings.memory_budget(budget) if budget else contextlib.nullcontext():
            return gp_work(model, extra["xs"].to(device), fit_steps=2)

    return build, work


def botorch_kronecker_case(budget=None):
    """Built on the device, as BoTorch users do: GPyTorch's ``LKJCholeskyFactorPrior`` (the task covariance prior)
    keeps its concentration as a plain tensor attribute that ``Module.to`` does not move, so a ``KroneckerMultiTaskGP``
    built on the CPU and moved fails in its prior on a GPU, exact or sketched (cornellius-gp/gpytorch#1985)."""
    from botorch.models import KroneckerMultiTaskGP

    def build():
        x, y, xs = data(400, 3, outputs=2)
        return None, None, {"x": x, "y": y, "xs": xs}

    def work(_, extra, device):
        torch.manual_seed(0)
        model = KroneckerMultiTaskGP(extra["x"], extra["y"])
        model.covar_module = rfgp.sketch(model.covar_module, 512, seed=0)
        with rfgp.settings.memory_budget(budget) if budget else contextlib.nullcontext():
            out = loss_and_grads(model)
            model.eval()
            post = model.posterior(extra["xs"])
            return {**out, "post_mean": post.mean, "post_var": post.variance}

    return build, work


def botorch_qlognei_case(n=300, width=1024):
    """qLogNEI's cached-root joint posterior: only the candidates' rows, from the kernel-space factor (N < F) or from
    the capacitance factor L_A (N > F)."""
    from botorch.acquisition.logei import qLogNoisyExpectedImprovement
    from botorch.models import SingleTaskGP
    from botorch.sampling import SobolQMCNormalSampler

    def build():
        x, y, xs = data(n, 3)
        model = SingleTaskGP(x, y.unsqueeze(-1))
        model.covar_module = rfgp.sketch(model.covar_module, width, method="orf", seed=0)
        return model, x, {"xs": xs, "x": x}

    def work(model, extra, device):
        out = loss_and_grads(model)
        model.eval()
        acq = qLogNoisyExpectedImprovement(model, X_baseline=extra["x"][:48], prune_baseline=False,
                                           sampler=SobolQMCNormalSampler(torch.Size([64]), seed=0))
        X = extra["xs"].to(device)[:8].reshape(4, 2, 3).clone().requires_grad_(True)
        value = acq(X)
        value.sum().backward()
        return {**out, "acq": value.detach(), "acq_grad": X.grad}

    return build, work


def botorch_mixed_case():
    """MixedSingleTaskGP: categorical features (one torch.where per column) times continuous ones."""
    from botorch.models import MixedSingleTaskGP

    def build():
        x, y, xs = data(233, 3)
        gen = torch.Generator().manual_seed(1)
        codes = torch.stack([torch.randint(0, k, (x.shape[0] + xs.shape[0],), generator=gen) for k in (3, 2)], -1)
        x = torch.cat([x, codes[: x.shape[0]].to(DTYPE)], -1)
        xs = torch.cat([xs, codes[x.shape[0]:].to(DTYPE)], -1)
        model = MixedSingleTaskGP(x, (y + x[:, 3]).unsqueeze(-1), cat_dims=[3, 4])
        model.covar_module = rfgp.sketch(model.covar_module, 1024, seed=0)
        return model, x, {"xs": xs}

    def work(model, extra, device):
        out = loss_and_grads(model)
        model.eval()
        post = model.posterior(extra["xs"].to(device))
        return {**out, "post_mean": post.mean, "post_var": post.variance}

    return build, work


def nystrom_scale_case():
    """Nyström under a kept top ScaleKernel (stop 35): the exact tree's attribute paths, FITC correction."""
    def build():
        x, y, xs = data(1500, 3)
        kernel = rfgp.sketch(ScaleKernel(RBFKernel(ard_num_dims=3)), 256, method="nystrom", x_sample=x,
                             landmarks="rls", seed=0)
        assert kernel.base_kernel.lengthscale is not None
        return UserGP(x, y, kernel).to(DTYPE), x, {"xs": xs}

    def work(model, extra, device):
        out = gp_work(model, extra["xs"].to(device), fit_steps=2)
        return {**out, "lengthscale": model.covar_module.base_kernel.lengthscale.detach()}

    return build, work


CASES = {
    "RBF ARD, ORF, N = 400 < F (kernel space)": regression_case(
        lambda d: ScaleKernel(RBFKernel(ard_num_dims=d)), 400, method="orf"),
    "RBF ARD, RFF, N = 2000 > F (feature space)": regression_case(
        lambda d: ScaleKernel(RBFKernel(ard_num_dims=d)), 2000, method="rff"),
    "RBF, SORF": regression_case(lambda d: ScaleKernel(RBFKernel()), 1000, width=256, method="sorf"),
    "RBF, Maclaurin (default sketch)": regression_case(
        lambda d: ScaleKernel(RBFKernel()), 1000, width=256, method="maclaurin"),
    "RBF, Nyström (k-means++)": None,  # filled below: needs x_sample
    "Matérn-½ / 3/2 / 5/2 sum": regression_case(
        lambda d: ScaleKernel(MaternKernel(nu=0.5)) + ScaleKernel(MaternKernel(nu=1.5))
        + ScaleKernel(MaternKernel(nu=2.5)), 1500, width=768),
    "Periodic × RBF + RQ (Mauna Loa tree)": regression_case(
        lambda d: ScaleKernel(PeriodicKernel() * RBFKernel()) + ScaleKernel(RQKernel()), 1500, width=512),
    "Polynomial (TensorSRHT sketch) + RBF": regression_case(
        lambda d: ScaleKernel(PolynomialKernel(power=2)) + ScaleKernel(RBFKernel()), 1500, width=512,
        method={"PolynomialKernel": "sketch"}),
    "chunked rows (memory_budget 1 MiB)": chunked_case(),
    "RBFKernelGrad (derivative observations)": derivative_case(),
    "curl-free vector field": vector_field_case("curl_free"),
    "curl- + divergence-free, rank-1 task noise": vector_field_case("helmholtz", rank=1),
    "decomposable multi-output": vector_field_case("decomposable"),
    "batch-independent outputs (from_batch_mvn)": batch_independent_case(),
    "set_num_features 128 → 1024": set_num_features_case(),
    "StreamingFeatureGP": streaming_case(),
    "BoTorch SingleTaskGP + qLogEI": botorch_case(),
    "DirichletGPClassifier (draws on the device)": classifier_case(),
    "Pyro RandomFeatureGP, SVI (draws on the device)": pyro_case(),
    "multitask tutorial model, Kronecker factors, diagonal task noise": multitask_kronecker_case(0),
    "multitask tutorial model, Kronecker factors, rank-1 task noise": multitask_kronecker_case(1),
    "multitask tutorial model, Kronecker factors from φ in row blocks (1 MiB budget)": multitask_kronecker_case(
        1, budget=2**20),
    "BoTorch KroneckerMultiTaskGP": botorch_kronecker_case(),
    "BoTorch KroneckerMultiTaskGP, root over a 8 MiB budget (chunked, factors from φ)": botorch_kronecker_case(2**23),
    "BoTorch SingleTaskGP + qLogNEI, N < F (kernel-space row blocks)": botorch_qlognei_case(),
    "BoTorch SingleTaskGP + qLogNEI, N > F (feature-space row blocks)": botorch_qlognei_case(2000, 256),
    "BoTorch MixedSingleTaskGP (categorical features)": botorch_mixed_case(),
    "Nyström (ridge leverage) under a kept ScaleKernel": nystrom_scale_case(),
}


def _nystrom_case():
    def build():
        x, y, xs = data(1500, 3)
        kernel = rfgp.sketch(ScaleKernel(RBFKernel()), 256, method="nystrom", x_sample=x, landmarks="kmeans++", seed=0)
        return UserGP(x, y, kernel).to(DTYPE), x, {"xs": xs}

    def work(model, extra, device):
        return gp_work(model, extra["xs"].to(device))

    return build, work


CASES["RBF, Nyström (k-means++)"] = _nystrom_case()

#: outputs drawn on the device after a re-draw: compared against the CPU's at Monte-Carlo (not round-off) tolerance
LOOSE = ("wide:", "redrawn:")


# --------------------------------------------------------------------------------------------------- harness

def to_device(tree, device):
    return {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in tree.items()}


#: the last frames of the first synchronisation seen at each site (written next to the report)
SYNC_STACKS: dict[str, str] = {}


@contextlib.contextmanager
def count_syncs(device, counter):
    """Counts host synchronisations (CUDA only) by the innermost rfgp frame that caused them."""
    if device.type != "cuda":
        yield
        return
    frames = []
    original = warnings.showwarning

    def record(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" in str(message):
            full = traceback.extract_stack()[:-1]
            stack = [f for f in full if "/rfgp/" in f.filename]
            site = (f"{os.path.relpath(stack[-1].filename)}:{stack[-1].lineno} {stack[-1].name}"
                    if stack else f"outside rfgp: {os.path.basename(filename)}:{lineno}")
            frames.append(site)
            SYNC_STACKS.setdefault(site, "".join(traceback.format_list(full[-12:])))
        else:
            original(message, category, filename, lineno, file, line)

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode("default")
            warnings.showwarning = original
    counter.update(frames)


def run(build, work, device):
    torch.manual_seed(0)  # initial values some modules draw (task-noise factors, task covariances)
    model, x, extra = build()
    if x is not None:
        materialise(model, x)
    model = copy.deepcopy(model).to(device) if model is not None else None
    if hasattr(model, "train_inputs") and model.train_inputs is not None:
        model.set_train_data(tuple(t.to(device) for t in model.train_inputs), model.train_targets.to(device),
                             strict=False)
    return model, work(model, to_device(extra, device), device)


def compare(reference: dict, result: dict) -> tuple[float, float, list[str]]:
    """Largest relative error over the strict outputs and over the loose (re-drawn) ones; problems found."""
    strict = loose = 0.0
    problems = []
    for key, ref in reference.items():
        got = result.get(key)
        if got is None:
            problems.append(f"{key} missing")
            continue
        got = got.detach().to("cpu", torch.float64)
        ref = ref.detach().to("cpu", torch.float64)
        if got.shape != ref.shape:
            problems.append(f"{key}: shape {tuple(got.shape)} vs {tuple(ref.shape)}")
            continue
        if not torch.isfinite(got).all():
            problems.append(f"{key}: non-finite")
            continue
        error = ((got - ref).abs().max() / ref.abs().max().clamp_min(1e-12)).item() if ref.numel() else 0.0
        if key.startswith(LOOSE):
            loose = max(loose, error)
        else:
            strict = max(strict, error)
    return strict, loose, problems


def device_of_outputs(result: dict, device) -> bool:
    return all(v.device.type == device.type for v in result.values() if torch.is_tensor(v))


def sync_report(case, device):
    """Synchronisations of one prediction and of one MLL + backward of a trained copy."""
    build, work = case
    model, _ = run(build, work, device)
    predicting, training = Counter(), Counter()
    if getattr(model, "train_inputs", None) is None:
        return predicting, training
    xs = torch.rand(64, model.train_inputs[0].shape[-1], dtype=DTYPE, device=device)
    predict(model, xs, likelihood=False)  # caches built once, outside the count
    with count_syncs(device, predicting):
        predict(model, xs, likelihood=False)
    with count_syncs(device, training):
        loss_and_grads(model)
    return predicting, training


def float32_check(device, out):
    """float32 on the device (TF32 matmuls off, then on) against float32 and float64 on the CPU."""
    build, _ = regression_case(lambda d: ScaleKernel(RBFKernel(ard_num_dims=d)), 5000, width=1024, method="orf")

    def outputs(dev, dtype):
        torch.manual_seed(0)
        model, x, extra = build()
        materialise(model, x)
        model = copy.deepcopy(model).to(device=dev, dtype=dtype)
        model.set_train_data(tuple(t.to(dev, dtype) for t in model.train_inputs), model.train_targets.to(dev, dtype),
                             strict=False)
        result = loss_and_grads(model)
        result.update(predict(model, extra["xs"].to(dev, dtype)))
        return result

    reference = outputs(torch.device("cpu"), torch.float64)
    rows = []
    settings = [("cpu", torch.float32, False)]
    if device.type == "cuda":
        settings += [("cuda", torch.float32, False), ("cuda", torch.float32, True), ("cuda", torch.float64, False)]
    for dev, dtype, tf32 in settings:
        previous = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
        try:
            result = outputs(torch.device(dev), dtype)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = previous
        errors = {key: compare({key: reference[key]}, {key: result[key]})[0]
                  for key in ("loss", "mean", "variance")}
        grads = max(compare({k: v}, {k: result[k]})[0] for k, v in reference.items() if k.startswith("grad:"))
        rows.append(f"| {dev} | {str(dtype)[6:]} | {tf32} | {errors['loss']:.1e} | {grads:.1e} | "
                    f"{errors['mean']:.1e} | {errors['variance']:.1e} |")
    out.append("\n## float32 against the float64 CPU result (N = 5000, F = 1024, ORF, RBF ARD)\n")
    out.append("Relative error, max |x − x₆₄| / max |x₆₄|, of the negative MLL, its parameter gradients and the "
               "predictive mean and variance.\n")
    out.append("| device | dtype | TF32 matmul | loss | gradients | mean | variance |")
    out.append("|---|---|---|---|---|---|---|")
    out.extend(rows)


def timed(device, fn, *args):
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn(*args)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def fresh_prediction(model, xs):
    model.train()  # drops the prediction caches: they are rebuilt, as after a training step
    return predict(model, xs)


def timing(device, out):
    """One MLL + gradient and one prediction: rfgp on device and CPU, GPyTorch's exact GP on the device."""
    rows = []
    sizes = ((20_000, 1024, torch.float32), (100_000, 1024, torch.float32), (20_000, 1024, torch.float64))
    for n, width, dtype in sizes:
        x, y, xs = data(n, 4, test=2048)
        x, y, xs = x.to(dtype), y.to(dtype), xs.to(dtype)
        configs = [("rfgp", device), ("rfgp", torch.device("cpu"))]
        if n <= 20_000 and device.type == "cuda":
            configs.append(("exact", device))
        for kind, dev in configs:
            exact = ScaleKernel(RBFKernel(ard_num_dims=4))
            kernel = exact if kind == "exact" else rfgp.sketch(exact, width, method="orf", seed=0)
            model = UserGP(x.to(dev), y.to(dev), kernel).to(device=dev, dtype=dtype)
            step = [timed(dev, loss_and_grads, model) for _ in range(3)]
            pred = [timed(dev, fresh_prediction, model, xs.to(dev)) for _ in range(3)]
            rows.append(f"| {n} | {width if kind == 'rfgp' else '—'} | {str(dtype)[6:]} | {kind} | {dev.type} | "
                        f"{min(step[1:]):.4f} | {min(pred[1:]):.4f} |")
            print(rows[-1], flush=True)
    out.append("\n## Timing: one MLL + gradient, one prediction (2048 points, caches rebuilt), seconds, best of 2 "
               "after a warm-up\n")
    out.append(f"CPU threads: {torch.get_num_threads()}.\n")
    out.append("| N | F | dtype | model | device | MLL + gradient [s] | prediction [s] |")
    out.append("|---|---|---|---|---|---|---|")
    out.extend(rows)


def timing_structured(device, out):
    """Multitask MLL + gradient (Kronecker factors), one qLogNEI value + gradient and the kernel-space MLL step at
    N = 1000, F = 2048 (issue 16's per-iteration case): rfgp against the exact GP."""
    from botorch.acquisition.logei import qLogNoisyExpectedImprovement
    from botorch.models import SingleTaskGP

    rows = []
    gen = torch.Generator().manual_seed(0)
    for kind in ("rfgp", "exact"):
        x = torch.rand(4000, 1, generator=gen, dtype=DTYPE)
        y = torch.sin(6 * x + torch.tensor([0.0, 1.0], dtype=DTYPE)) + 0.1 * torch.randn(4000, 2, generator=gen,
                                                                                             dtype=DTYPE)
        kernel = gpytorch.kernels.MultitaskKernel(RBFKernel(), num_tasks=2, rank=1)
        kernel = rfgp.sketch(kernel, 256, seed=0) if kind == "rfgp" else kernel
        likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(2, rank=1)
        model = MultitaskGP(x.to(device), y.to(device), likelihood, kernel).to(device=device, dtype=DTYPE)
        step = [timed(device, loss_and_grads, model) for _ in range(3)]
        rows.append(f"| multitask tutorial model, N = 4000, T = 2, rank-1 task noise, F = 256 | {kind} | MLL + "
                    f"gradient | {min(step[1:]):.4f} |")
        print(rows[-1], flush=True)
    for n, baseline in ((1000, 64), (5000, 256)):  # kernel space (N < F), feature space (N > F)
        x = torch.rand(n, 12, generator=gen, dtype=DTYPE)
        y = (torch.sin(3 * x[:, :4]).sum(-1) + 0.3 * torch.randn(n, generator=gen, dtype=DTYPE))[:, None]
        candidates = torch.rand(4, 2, 12, generator=gen, dtype=DTYPE).to(device)
        for kind in ("rfgp", "exact"):
            model = SingleTaskGP(x.to(device), y.to(device))
            model.covar_module.lengthscale = torch.tensor([0.3] * 4 + [3.0] * 8)
            if kind == "rfgp":
                model.covar_module = rfgp.sketch(model.covar_module, 1024, method="orf", seed=0)
            model = model.to(device).eval()
            acquisition = qLogNoisyExpectedImprovement(model, X_baseline=x[:baseline].to(device),
                                                       prune_baseline=False)

            def evaluate(acquisition=acquisition, candidates=candidates):
                X = candidates.clone().requires_grad_(True)
                torch.autograd.grad(acquisition(X).sum(), X)

            times = [timed(device, evaluate) for _ in range(6)]
            rows.append(f"| qLogNEI, N = {n}, d = 12, {baseline} baseline, 4 × 2 candidates, F = 1024 | {kind} | "
                        f"value + gradient | {min(times[1:]):.4f} |")
            print(rows[-1], flush=True)
    x = torch.rand(1000, 4, generator=gen, dtype=DTYPE)  # issue 16's per-iteration case: N = 1000 ≤ F = 2048
    y = torch.sin(2 * x).sum(-1) + 0.1 * torch.randn(1000, generator=gen, dtype=DTYPE)
    for dtype in (torch.float32, torch.float64):
        for kind in ("rfgp (kernel space)", "exact (default)", "exact (Cholesky)"):
            kernel = ScaleKernel(RBFKernel())
            kernel = rfgp.sketch(kernel, 2048, method="rff", seed=0) if kind.startswith("rfgp") else kernel
            model = UserGP(x.to(device, dtype), y.to(device, dtype), kernel).to(device=device, dtype=dtype)
            cholesky = gpytorch.settings.max_cholesky_size(2000) if "Cholesky" in kind else contextlib.nullcontext()
            with cholesky:
                times = [timed(device, loss_and_grads, model) for _ in range(6)]
            rows.append(f"| N = 1000, d = 4, F = 2048, {str(dtype)[6:]} | {kind} | MLL + gradient | "
                        f"{min(times[1:]):.4f} |")
            print(rows[-1], flush=True)
    out.append("\n## Timing: structured workflows on the device (seconds, best after a warm-up)\n")
    out.append("| workflow | model | step | seconds |")
    out.append("|---|---|---|---|")
    out.extend(rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "gpu_parity.md"))
    parser.add_argument("--no-timing", action="store_true")
    parser.add_argument("--cases", default="", help="run only the cases whose name contains one of these "
                        "comma-separated substrings (default: all)")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: CUDA is not available here (torch {torch.__version__}); "
                     "--device cpu runs the harness CPU against CPU")
    out = ["# CUDA parity of rfgp's workflows\n", f"Load average (1, 5, 15 min) before: {os.getloadavg()}.\n"]
    if device.type == "cuda":
        out.append(f"Device: {torch.cuda.get_device_name(device)}; torch {torch.__version__}, gpytorch "
                   f"{gpytorch.__version__}; float64; TF32 matmul allowed: {torch.backends.cuda.matmul.allow_tf32}.\n")
    out.append("Relative error: max |GPU − CPU| / max |CPU| over the outputs of a case (loss, every parameter "
               "gradient, trained parameters after `fit_mll` steps, predictive mean and variance, the case's own "
               "outputs); *after re-draw*: outputs whose random draws are made on the device (after "
               "`set_num_features`, a classifier fitted there, Pyro SVI), so they differ by Monte-Carlo error, not "
               "round-off. "
               "Syncs: host synchronisations counted by `torch.cuda.set_sync_debug_mode` in one no-grad prediction "
               "(caches built) and in one MLL forward + backward.\n")
    out.append("| case | status | rel. error | after re-draw | outputs on device | syncs: predict | syncs: MLL + grad "
               "|")
    out.append("|---|---|---|---|---|---|---|")
    sync_sites = Counter()
    failures = []
    wanted = [part for part in args.cases.split(",") if part]
    for name, case in CASES.items():
        if wanted and not any(part in name for part in wanted):
            continue
        start = time.perf_counter()
        try:
            _, reference = run(*case, torch.device("cpu"))
            _, result = run(*case, device)
            strict, loose, problems = compare(reference, result)
            on_device = device_of_outputs(result, device)
            predicting, training = sync_report(case, device)
            sync_sites.update(predicting)
            sync_sites.update(training)
            status = "ok" if not problems and on_device and strict < 1e-6 else "CHECK"
            row = (f"| {name} | {status}{': ' + '; '.join(problems) if problems else ''} | {strict:.1e} | "
                   f"{loose:.1e} | {on_device} | {sum(predicting.values())} | {sum(training.values())} |")
            if status != "ok":
                failures.append(name)
        except Exception as error:  # a failing case is reported with its traceback, the others still run
            failures.append(name)
            tb = traceback.format_exc().strip().splitlines()
            row = f"| {name} | FAILED: {type(error).__name__}: {str(error)[:300]} | | | | | |"
            print("\n".join(tb[-25:]), flush=True)
        out.append(row)
        print(row, f"({time.perf_counter() - start:.1f} s)", flush=True)
    if sync_sites:
        out.append("\n## Host synchronisations by site (all cases)\n")
        out.append("| site | count |")
        out.append("|---|---|")
        out.extend(f"| `{site}` | {count} |" for site, count in sync_sites.most_common(40))
    float32_check(device, out)
    if not args.no_timing:
        timing_structured(device, out)
        timing(device, out)
    out.append(f"\nLoad average after: {os.getloadavg()}.")
    out.append(f"\nFailed or to check: {', '.join(failures) if failures else 'none'}.")
    with open(args.out, "w") as handle:
        handle.write("\n".join(out) + "\n")
    if SYNC_STACKS:
        with open(os.path.splitext(args.out)[0] + "_sync_stacks.txt", "w") as handle:
            handle.write("\n\n".join(f"== {site}\n{stack}" for site, stack in SYNC_STACKS.items()))
    print("\n".join(out))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
