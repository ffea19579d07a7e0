"""What is built on trained random-feature GPs and feature maps (posterior function draws, which the
scikit-learn regressor uses, are :mod:`rfgp.models.sampling`; ``rfgp.applications.sampling`` still imports).

* :mod:`~rfgp.applications.vector_fields` — prior/posterior vector-field samples and autograd
  physics checks (divergence, curl);
* :mod:`~rfgp.applications.distances` — kernel mean embeddings, MMD, two-sample tests, kernel PCA.
"""
