"""Feature-space inference: from the features Φ to the marginal likelihood and the posterior.

The kernels hand over Φ (N × F) instead of an N × N matrix; this layer keeps it factored:

* :mod:`~rfgp.inference.linalg` — the statistics ΦᵀWΦ and ΦᵀWR with a lean backward pass;
* :mod:`~rfgp.inference.statistics_precision` — float32 or float64 statistics for float32 features, chosen by an
  a-priori bound of their float32 rounding;
* :mod:`~rfgp.inference.triangular_statistics` — the same for Nyström features Φ = K·L⁻ᵀ, with a backward
  fused through the triangular solve;
* :mod:`~rfgp.inference.chunking` — the same statistics over chunks of rows, recomputed in the
  backward pass, under :class:`rfgp.settings.memory_budget`;
* :mod:`~rfgp.inference.kernel_space` — the N × N form ΦΦᵀ + D, chosen by flop count when N ≲ F;
* :mod:`~rfgp.inference.operators` — ``LinearOperator`` s ΦΦᵀ (+ D) whose solves, log-determinants
  and ``inv_quad_logdet`` go through the F × F capacitance matrix;
* :mod:`~rfgp.inference.log_prob` — GPyTorch's Gaussian log-density routed to those operators;
* :mod:`~rfgp.inference.prediction`, :mod:`~rfgp.inference.multioutput` — weight-space prediction
  strategies (single- and multi-output) that GPyTorch's ``ExactGP`` uses for the posterior;
* :mod:`~rfgp.inference.eager_covariances` — those strategies for eagerly evaluated covariances
  (``gpytorch.settings.lazily_evaluate_kernels(False)``);
* :mod:`~rfgp.inference.task_noise` — ΦΦᵀ + I_N ⊗ Σ_T (correlated multitask noise), whitened per point;
* :mod:`~rfgp.inference.kronecker_tasks` — a sketched ``MultitaskKernel``'s covariance φφᵀ ⊗ A with its Kronecker
  factors (BoTorch's ``KroneckerMultiTaskGP.posterior``): the data factor's eigenpairs from the thin SVD of φ, and
  solves with c·I_N ⊗ Σ_T noise through both factors' eigendecompositions;
* :mod:`~rfgp.inference.kronecker_posterior` — its predictive mean and variance at test points from the factors φ* and
  B of the test root, never pushing φ* ⊗ B through the posterior where that costs more;
* :mod:`~rfgp.inference.independent_tasks` — T independent outputs (GPyTorch's batch-independent GP) as T
  single-output systems Φ_tΦ_tᵀ + D_t under diagonal noise;
* :mod:`~rfgp.inference.posterior_covariance` — the posterior covariance Φ*A⁻¹Φ*ᵀ kept as its n × F root
  for products and sampling, with a square Cholesky root decomposition for BoTorch's cached-root samplers;
* :mod:`~rfgp.inference.classification` — C regressions sharing Φ (Dirichlet classification);
* :mod:`~rfgp.inference.complex_posterior` — the complex-feature GP of paper 000 App. D;
* :mod:`~rfgp.inference.cholesky_update`, :mod:`~rfgp.inference.distributed` — rank-k updates of
  the capacitance factor (streaming) and statistics summed over ``torch.distributed`` ranks;
* :mod:`~rfgp.inference.fantasy_update` — fantasy (BoTorch ``fantasize``) caches as a rank-q update of the
  parent's F × F caches;
* :mod:`~rfgp.inference.deferred_graph` — values computed without a graph whose backward pass rebuilds them with
  one, only where a gradient through them is asked for (a fantasy's training caches under ``propagate_grads``).

It imports :mod:`rfgp.core` and :mod:`rfgp.features` only; the kernels, likelihoods and models
above it import from here.
"""
