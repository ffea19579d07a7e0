import torch, gpytorch, rfgp, time
torch.set_default_dtype(torch.float64)
torch.manual_seed(0)
def franke(x):
    X, Y = x[:, 0], x[:, 1]
    x = x.clone().requires_grad_(True)
    f = torch.sin(2*x[:,0]) * torch.cos(3*x[:,1]) + 0.5*x[:,0]**2
    g, = torch.autograd.grad(f.sum(), x)
    return torch.cat([f.detach().unsqueeze(-1), g], -1)
n = 60
train_x = torch.rand(n, 2)
train_y = franke(train_x) + 0.02*torch.randn(n, 3)
class GP(gpytorch.models.ExactGP):
    def __init__(self, x, y, lik, kernel):
        super().__init__(x, y, lik)
        self.mean_module = gpytorch.means.ConstantMeanGrad()
        self.covar_module = gpytorch.kernels.ScaleKernel(kernel)
    def forward(self, x):
        return gpytorch.distributions.MultitaskMultivariateNormal(self.mean_module(x), self.covar_module(x))
def fit(kernel_fn, iters=60):
    lik = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=3)
    model = GP(train_x, train_y, lik, kernel_fn())
    model.train(); lik.train()
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(lik, model)
    t=time.time()
    for i in range(iters):
        opt.zero_grad(); loss = -mll(model(train_x), train_y); loss.backward(); opt.step()
    print("loss", loss.item(), time.time()-t)
    return model, lik
exact, elik = fit(lambda: gpytorch.kernels.RBFKernelGrad(ard_num_dims=2))
sk, slik = fit(lambda: rfgp.kernels.SketchedRBFKernelGrad(1024, ard_num_dims=2, seed=0))
print(type(sk.prediction_strategy) if hasattr(sk,'prediction_strategy') else None)
test_x = torch.rand(50, 2)
for m, l in [(exact, elik), (sk, slik)]:
    m.eval(); l.eval()
    with torch.no_grad():
        p = l(m(test_x))
    print(type(m.prediction_strategy).__name__, "rmse", ((p.mean - franke(test_x))**2).mean(0).sqrt(), p.variance.mean(0))
