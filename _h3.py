import torch, gpytorch, rfgp
torch.set_default_dtype(torch.float64)
torch.manual_seed(0)
x = torch.randn(40, 2); y = torch.sin(x[:,0]) + 0.1*torch.randn(40)
class GP(gpytorch.models.ExactGP):
    def __init__(s, k):
        super().__init__(x, y, gpytorch.likelihoods.GaussianLikelihood()); s.m = gpytorch.means.ConstantMean(); s.k = gpytorch.kernels.ScaleKernel(k)
    def forward(s, z): return gpytorch.distributions.MultivariateNormal(s.m(z), s.k(z))
model = GP(rfgp.kernels.SketchedRBFKernel(64, ard_num_dims=2, seed=0))
mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
p = model.k.base_kernel.raw_lengthscale
for chunk in [None, 10]:
    with rfgp.settings.chunk_size(chunk):
        loss = -mll(model(x), y)
        g, = torch.autograd.grad(loss, p, create_graph=True)
        H = torch.stack([torch.autograd.grad(g[0, i], p, retain_graph=True)[0][0] for i in range(2)])
    print(chunk, H)
