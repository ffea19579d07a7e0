"""What is built on trained random-feature GPs and feature maps.

* :mod:`~rfgp.applications.sampling` — posterior function draws in weight space (Thompson
  sampling at featurisation cost; BoTorch's pathwise sampling uses them);
* :mod:`~rfgp.applications.vector_fields` — prior/posterior vector-field samples and autograd
  physics checks (divergence, curl);
* :mod:`~rfgp.applications.distances` — kernel mean embeddings, MMD, two-sample tests, kernel PCA.
"""
