"""The solver behind vitpos' linear probes: softmax heads fitted by per-head batched L-BFGS.

A probe is multinomial logistic regression on standardised features, fitted full-batch in torch
(CPU or GPU) with L-BFGS, preconditioned by the feature covariance. The objective is
    mean cross-entropy + l2 / 2 * ||W||^2        (bias unpenalised),
which is scikit-learn's LogisticRegression objective with C = 1 / (l2 * n_train_tokens); it is
minimised to the same gradient tolerance as scikit-learn's lbfgs (max |grad| <= 1e-4).
Several probes on the same tokens (row, column, controls) share every evaluation's matmul but
each runs its own L-BFGS (see `lbfgs_heads`); the l2 grid is walked from strong to weak, each fit
warm-started from the previous one with its curvature pairs carried over.

Pieces: `standardise_stats` / `standardised_design` / `Design` build the (transposed) design
matrix and its covariance eigenbasis; `SoftmaxHeads` is the objective and analytic gradient of
several heads on one design, with the preconditioner; `HeadLBFGS` is one head's curvature pairs
and compact-form direction; `lbfgs_heads` is the batched loop; `fit_softmax_heads` the entry point.

Why hand-written rather than scikit-learn's LogisticRegression (same objective, same
tolerance): scikit-learn fits one probe at a time, from scratch at every l2, unpreconditioned,
in numpy, and needs 15-200 iterations per fit on real activations (up to 413 on strongly
anisotropic ones). Here every probe keeps its own L-BFGS while all probes share one matmul per
evaluation, the covariance preconditioner removes the anisotropy, the l2 path carries warm
starts and curvature pairs, and logits live as (classes, tokens) so softmax reductions run over
contiguous rows. That gives 5-30 evaluations per fit and 14-111x less CPU time at equal test
accuracy (benchmarks/bench_probes.py: same features, split and l2 grid; numbers in
benchmarks/README.md), and the fit runs in torch on the features' device. tests/unit/test_lbfgs.py
checks that each head lands on scikit-learn's optimum.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F

_STD_EPS = 1e-6


def all_finite(x: torch.Tensor) -> bool:
    """No NaN / inf in x. A float64 sum of float32 values cannot overflow, so it is finite iff
    every value is; one reduction is ~50x cheaper on CPU than isfinite(x).all()."""
    return bool(torch.isfinite(x.sum(dtype=torch.float64)))


def standardise_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    mean = x.mean(0)
    # Two-pass population std: same value as x.std(0, unbiased=False), ~15x faster on CPU
    # (torch's std reduces over dim 0 of a row-major matrix on a slow path).
    std = (x - mean).pow_(2).mean(0).sqrt_()
    # Constant features get std 1 so they stay constant instead of blowing up.
    std = torch.where(std > _STD_EPS, std, torch.ones_like(std))
    return mean, std


def standardised_design(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """(N, D + 1): standardised features plus a ones column, so the bias rides in the matmul."""
    out = torch.empty(x.shape[0], x.shape[1] + 1, device=x.device, dtype=torch.float32)
    torch.sub(x, mean, out=out[:, :-1])
    out[:, :-1].div_(std)
    out[:, -1] = 1.0
    return out


_PRECOND_TOKENS = 8192  # tokens used to estimate the feature covariance for the preconditioner


class Design:
    """A `standardised_design` matrix, stored transposed, plus its feature-covariance eigenbasis.

    The (D + 1, N) layout is a speed choice: every softmax reduction then runs over a handful of
    contiguous length-N rows (one per class) instead of over the short inner axis of an (N, K)
    matrix, which is several times faster on CPU; the matmuls cost the same either way.

    Cov(x_std) ~ U diag(e) U^T (estimated on a strided subsample). L-BFGS does its algebra in
    the rotated coordinates [U^T w; b] (see `HeadLBFGS`), where the covariance preconditioner
    is diagonal; the design itself stays unrotated (fits on a rotated float32 copy were seen to
    take ~30% more iterations, a rounding effect in the near-null directions).
    """

    def __init__(self, xs: torch.Tensor):
        n = xs.shape[0]
        self.n = n
        self.xt = xs.T.contiguous()  # (D + 1, N)
        # Evenly strided tokens: deterministic, and a preconditioner needs no exact covariance.
        sub = xs[:: max(1, n // _PRECOND_TOKENS), :-1].double()
        e, u = torch.linalg.eigh(sub.T @ sub / sub.shape[0])
        self.e = e.clamp_min(0)  # float64: the L-BFGS algebra runs in float64
        self.u = u

    def rotate(self, theta: torch.Tensor) -> torch.Tensor:
        """(D + 1, K) parameters -> float64 [U^T w; b]."""
        theta = theta.double()
        return torch.cat([self.u.T @ theta[:-1], theta[-1:]])

    def unrotate(self, theta: torch.Tensor) -> torch.Tensor:
        """Inverse of `rotate` (float64)."""
        return torch.cat([self.u @ theta[:-1], theta[-1:]])


class SoftmaxHeads:
    """Objective and gradient of several independent softmax heads sharing one token matrix.

    `design` is a `Design`. Head h has parameters theta_h, a (D + 1, K_h) tensor: weights with
    the bias as the last row. The objective is a sum of per-head objectives, so the joint
    optimum is each head's own optimum; evaluating several heads in one
    (sum K, D + 1) @ (D + 1, N) matmul per evaluation is what makes fitting them together cheap.
    Gradients are analytic (no autograd): softmax - one-hot, then one matmul.
    """

    def __init__(self, design: Design, targets: list[torch.Tensor], num_classes: list[int], l2s: list[float]):
        xt = design.xt
        self.design = design
        self.xt = xt
        self.n = design.n
        self.num_classes = [int(k) for k in num_classes]
        self.l2s = [float(v) for v in l2s]
        self.slices = []
        start = 0
        for k in self.num_classes:
            self.slices.append(slice(start, start + k))
            start += k
        self.targets = [y.to(xt.device) for y in targets]
        # Transposed one-hot targets, so d loss / d logits is a plain subtraction, and each
        # token's true-class logit as one gather from the flattened (K, N) logits.
        self.onehots = [F.one_hot(y, k).T.to(xt.dtype).contiguous()
                        for y, k in zip(self.targets, self.num_classes, strict=False)]
        tokens = torch.arange(self.n, device=xt.device)
        self.true_idx = [y * self.n + tokens for y in self.targets]
        self.curv = [0.5] * len(self.num_classes)  # softmax curvature per head, see head_values()

    def head_values(self, thetas: list[torch.Tensor], heads: list[int]) -> tuple[list[float], torch.Tensor]:
        """Objective of each head in `heads` at its parameters, and N * d objective / d logits of
        those heads stacked as one (sum K, N) tensor. One exp per evaluation serves both."""
        w = thetas[0] if len(thetas) == 1 else torch.cat(thetas, 1)
        logits = w.T @ self.xt  # (sum K, N)
        fs = []
        start = 0
        for theta, h in zip(thetas, heads, strict=True):
            k = self.num_classes[h]
            z = logits[start : start + k]  # (K, N), contiguous rows
            start += k
            m = z.amax(0)
            nll = z.reshape(-1).take(self.true_idx[h]).neg_().add_(m)  # m - true logit
            p = z.sub_(m).exp_()
            tot = p.sum(0)
            # Sums in float64: a float32 sum over N tokens is off by ~1e-6, about the decrease
            # an L-BFGS step makes near max|grad| = 1e-4, which would stall the line search.
            f = float(nll.add_(tot.log()).sum(dtype=torch.float64)) / self.n
            fs.append(f + 0.5 * self.l2s[h] * float(theta[:-1].pow(2).sum(dtype=torch.float64)))
            p.div_(tot)
            # Mean eigenvalue of the per-token logit Hessian diag(p) - p p^T: the softmax's
            # share of the curvature, used to scale the preconditioner.
            pf = p.reshape(-1)
            self.curv[h] = (1.0 - float(pf @ pf) / self.n) / k
            p.sub_(self.onehots[h])
        return fs, logits  # logits now hold softmax - one-hot, per token

    def head_grads(self, thetas: list[torch.Tensor], heads: list[int], resid: torch.Tensor) -> list[torch.Tensor]:
        """Gradient of each head in `heads`, from `head_values`' stacked residuals."""
        g = (self.xt @ resid.T).div_(self.n)
        out, start = [], 0
        for theta, h in zip(thetas, heads, strict=True):
            k = self.num_classes[h]
            gh = g[:, start : start + k].contiguous()
            start += k
            gh[:-1].add_(theta[:-1], alpha=self.l2s[h])
            out.append(gh)
        return out

    def head_precondition_diag(self, h: int) -> torch.Tensor:
        """(D + 1, 1) float64 approximate inverse Hessian of head h, diagonal in the design's
        rotated coordinates (`Design.rotate`): 1 / (c * e + l2) per weight row.

        Real activations are strongly anisotropic even after standardising, which is what makes
        plain L-BFGS (and scikit-learn) take hundreds of steps; this removes that part. c is the
        softmax's mean curvature at the latest evaluation; the bias row (the ones column, unit
        second moment, uncorrelated with the centred features) gets 1 / c.
        """
        c = max(self.curv[h], 1e-6)
        e = self.design.e
        # (floored: with l2 = 0, a constant feature would otherwise give 1 / 0)
        return torch.cat([1.0 / (c * e + self.l2s[h]).clamp_min(1e-12), e.new_full((1,), 1.0 / c)])[:, None]

    # Whole-parameter views (all heads in one (D + 1, sum K) tensor), for checks and tests.
    def value(self, theta: torch.Tensor) -> tuple[float, torch.Tensor]:
        heads = list(range(len(self.slices)))
        fs, resid = self.head_values([theta[:, sl] for sl in self.slices], heads)
        return sum(fs), resid

    def grad(self, theta: torch.Tensor, resid: torch.Tensor) -> torch.Tensor:
        heads = list(range(len(self.slices)))
        return torch.cat(self.head_grads([theta[:, sl] for sl in self.slices], heads, resid), 1)

    def precondition(self, q: torch.Tensor) -> torch.Tensor:
        d = self.design
        parts = [d.unrotate(d.rotate(q[:, sl]) * self.head_precondition_diag(h)) for h, sl in enumerate(self.slices)]
        return torch.cat(parts, 1).to(q.dtype)


class HeadLBFGS:
    """L-BFGS state of one head: its curvature pairs and current point, objective and gradient.

    Pairs are kept in the design's rotated coordinates (`Design.rotate`), where the
    preconditioner M is diagonal, as rows of float64 matrices S, Y, and H g is computed in the
    compact form of Byrd, Nocedal & Schnabel (1994, thm 2.2) with H0 = gamma * M:
        H g = H0 g + S^T R^-T ((D + Y H0 Y^T) p - Y H0 g) - (H0 Y^T) p,   p = R^-1 S g,
    R = upper triangle of S Y^T, D its diagonal. That is the two-loop recursion's result (a
    test checks it) in a dozen tensor ops instead of four per stored pair.
    """

    def __init__(self, theta: torch.Tensor, history: int, design: Design):
        self.design = design
        self.theta = theta
        self.f = math.inf
        self._g: torch.Tensor | None = None
        self.history = history
        self.s = theta.new_zeros(0, theta.numel(), dtype=torch.float64)
        self.y = theta.new_zeros(0, theta.numel(), dtype=torch.float64)

    @property
    def g(self) -> torch.Tensor:
        """The gradient at `theta`; set by the optimiser before any direction is asked for."""
        if self._g is None:
            raise RuntimeError("HeadLBFGS.g is read before a gradient was set")
        return self._g

    @g.setter
    def g(self, value: torch.Tensor) -> None:
        self._g = value

    def push(self, s: torch.Tensor, y: torch.Tensor) -> None:
        s, y = self.design.rotate(s).reshape(1, -1), self.design.rotate(y).reshape(1, -1)
        if float(s @ y.T) > 1e-10:  # keep the pair only when curvature is positive (always, if l2 > 0)
            self.s = torch.cat([self.s[1 - self.history :] if self.history > 1 else self.s[:0], s])
            self.y = torch.cat([self.y[1 - self.history :] if self.history > 1 else self.y[:0], y])

    def forget(self) -> None:
        self.s, self.y = self.s[:0], self.y[:0]

    def direction(self, m_diag: torch.Tensor | None) -> torch.Tensor:
        """-H g, H0 = gamma * diag(m_diag) (None: identity), gamma from the newest pair."""
        shape = self.g.shape
        g = self.design.rotate(self.g).reshape(-1)
        m = None if m_diag is None else m_diag.double().expand_as(self.g).reshape(-1)
        mg = g if m is None else m * g
        if not self.s.shape[0]:
            return self._back(-mg, shape)
        s, y = self.s, self.y
        my = y if m is None else y * m
        sy = s @ y.T
        gamma = float(sy[-1, -1]) / float(my[-1] @ y[-1])
        r = sy.triu()
        p = torch.linalg.solve_triangular(r, (s @ g)[:, None], upper=True)
        w = sy.diagonal()[:, None] * p + gamma * ((my @ y.T) @ p - (my @ g)[:, None])
        v = torch.linalg.solve_triangular(r.T, w, upper=False)
        hg = gamma * mg + (s.T @ v - gamma * (my.T @ p)).squeeze(1)
        return self._back(-hg, shape)

    def _back(self, d: torch.Tensor, shape) -> torch.Tensor:
        return self.design.unrotate(d.reshape(shape)).to(self.g.dtype)

    def direction_two_loop(self, m_diag: torch.Tensor | None) -> torch.Tensor:
        """The same -H g by the classic two-loop recursion (reference for tests)."""
        shape = self.g.shape
        q = -self.design.rotate(self.g).reshape(-1)
        alphas = []
        for s, y in zip(reversed(self.s), reversed(self.y), strict=True):
            a = float(s @ q) / float(s @ y)
            alphas.append(a)
            q -= a * y
        if m_diag is not None:
            q = q * m_diag.double().expand_as(self.g).reshape(-1)
        if self.s.shape[0]:
            s_new, y_new = self.s[-1], self.y[-1]
            my = y_new if m_diag is None else y_new * m_diag.double().expand_as(self.g).reshape(-1)
            q = q * (float(s_new @ y_new) / float(my @ y_new))
        for (s, y), a in zip(zip(self.s, self.y, strict=True), reversed(alphas), strict=True):
            q += (a - float(y @ q) / float(s @ y)) * s
        return self._back(q, shape)


@torch.no_grad()
def lbfgs_heads(
    obj: SoftmaxHeads,
    theta: torch.Tensor,
    *,
    max_iter: int,
    tol: float,
    history: int = 40,
    memory: dict | None = None,
    precondition: bool = True,
) -> tuple[torch.Tensor, int]:
    """Minimise the sum of `obj`'s heads: one L-BFGS per head, sharing every evaluation.

    theta: (D + 1, sum K), the heads side by side. Each head
    has its own curvature pairs, its own Armijo backtracking line search and its own stopping
    test: the objective is separable, so a joint L-BFGS would only mix unrelated curvature and
    make every head wait for the slowest; here the heads still in progress are evaluated
    together in one matmul and a head leaves the batch once it has converged. A head stops when
    max|grad| <= tol (scikit-learn's lbfgs criterion), when its objective stops decreasing in
    float precision, or after max_iter iterations. Returns (theta, iterations of the longest head).

    `memory` (a dict, updated in place) carries each head's curvature pairs along a
    regularisation path: the penalty's Hessian is l2 * I on the weights, so a pair (s, y) stays
    exact under a new l2 after y += (l2_new - l2_old) * s. Warm starts then skip L-BFGS's slow
    first iterations.
    """
    states = [
        HeadLBFGS(theta[:, sl].clone(memory_format=torch.contiguous_format), history, obj.design) for sl in obj.slices
    ]
    _warm_start(states, obj, memory, history)
    heads = list(range(len(obj.slices)))
    fs, resid = obj.head_values([st.theta for st in states], heads)
    for st, f, g in zip(states, fs, obj.head_grads([st.theta for st in states], heads, resid), strict=True):
        st.f, st.g = f, g
    active = [h for h in heads if float(states[h].g.abs().max()) > tol]
    it = 0
    while active and it < max_iter:
        it += 1
        steps, slopes, t = _directions(obj, states, active, precondition)
        accepted = _line_search(obj, states, active, steps, slopes, t)
        # A head left pending has no representable decrease left: converged as far as float
        # precision allows, it leaves the batch.
        moved = [h for h in active if h in accepted]
        if not moved:
            break
        rows = [accepted[h][2] for h in moved]
        new_gs = obj.head_grads([accepted[h][0] for h in moved], moved, rows[0] if len(rows) == 1 else torch.cat(rows))
        still = []
        for h, new_g in zip(moved, new_gs, strict=True):
            st = states[h]
            new_theta, new_f, _ = accepted[h]
            st.push(new_theta - st.theta, new_g - st.g)
            decrease = st.f - new_f
            st.theta, st.f, st.g = new_theta, new_f, new_g
            if float(new_g.abs().max()) > tol and decrease > 1e-9 * max(1.0, abs(new_f)):
                still.append(h)
        active = still
    if memory is not None:
        memory["heads"] = [
            {"k": k, "l2": l2, "s": st.s, "y": st.y}
            for k, l2, st in zip(obj.num_classes, obj.l2s, states, strict=False)
        ]
    return torch.cat([st.theta for st in states], 1), it


def _warm_start(states: list[HeadLBFGS], obj: SoftmaxHeads, memory: dict | None, history: int) -> None:
    """Each head's curvature pairs from `memory` (a previous fit on the path), moved to the new l2:
    y += (l2_new - l2_old) * s on the weights (the bias is unpenalised); pairs left without
    positive curvature are dropped."""
    old = memory.get("heads") if memory else None
    if old is None or [m["k"] for m in old] != obj.num_classes:
        return
    for st, m, l2 in zip(states, old, obj.l2s, strict=True):
        if m["s"].shape[0]:
            weights = torch.ones(st.theta.shape, device=st.theta.device, dtype=torch.float64)
            weights[-1] = 0.0  # the bias is unpenalised
            st.s = m["s"]
            st.y = m["y"] + (l2 - m["l2"]) * m["s"] * weights.reshape(1, -1)
            keep = (st.s * st.y).sum(1) > 1e-10
            st.s, st.y = st.s[keep][-history:], st.y[keep][-history:]


def _directions(obj: SoftmaxHeads, states: list[HeadLBFGS], active: list[int],
                precondition: bool) -> tuple[dict[int, torch.Tensor], dict[int, float], dict[int, float]]:
    """Per active head its L-BFGS step, the slope along it and the first step length to try."""
    steps, slopes, t = {}, {}, {}
    for h in active:
        st = states[h]
        m_diag = obj.head_precondition_diag(h) if precondition else None
        q = st.direction(m_diag)
        gd = float(st.g.reshape(-1) @ q.reshape(-1))
        if not gd < 0:  # not a descent direction (numerical trouble): drop the history
            st.forget()
            q = st.direction(m_diag)
            gd = float(st.g.reshape(-1) @ q.reshape(-1))
        steps[h], slopes[h] = q, gd
        # Unpreconditioned first steps are scaled like torch's LBFGS; else try the full step.
        t[h] = 1.0 if (st.s.shape[0] or precondition) else min(1.0, 1.0 / float(st.g.abs().sum()))
    return steps, slopes, t


def _line_search(obj: SoftmaxHeads, states: list[HeadLBFGS], active: list[int], steps: Mapping[int, torch.Tensor],
                 slopes: Mapping[int, float],
                 t: dict[int, float]) -> dict[int, tuple[torch.Tensor, float, torch.Tensor]]:
    """Armijo backtracking, per head: {head: (trial theta, its objective, its residual rows)} for
    the heads whose trial point was accepted; those accepted drop out of the retries (at most 30)."""
    accepted: dict[int, tuple[torch.Tensor, float, torch.Tensor]] = {}
    pending = list(active)
    for _ in range(30):
        trial = [torch.add(states[h].theta, steps[h], alpha=t[h]) for h in pending]
        new_fs, new_resid = obj.head_values(trial, pending)
        retry, start = [], 0
        for h, th, f in zip(pending, trial, new_fs, strict=True):
            k = obj.num_classes[h]
            if f <= states[h].f + 1e-4 * t[h] * slopes[h]:
                accepted[h] = (th, f, new_resid[start : start + k])
            else:
                t[h] *= 0.5
                retry.append(h)
            start += k
        pending = retry
        if not pending:
            break
    return accepted


def fit_softmax_heads(
    xs: torch.Tensor | Design,
    targets: list[torch.Tensor],
    num_classes: list[int],
    l2s: list[float],
    init: Sequence[tuple[torch.Tensor, torch.Tensor] | None] | None = None,
    *,
    max_iter: int = 200,
    tol: float = 1e-4,
    memory: dict | None = None,
    precondition: bool = True,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Fit independent softmax heads (one per target) on one (N, D + 1) `standardised_design`.

    Returns one (weight (D, K), bias (K,)) per head; `init` optionally warm-starts heads and
    `memory` carries L-BFGS curvature along an l2 path on the same `Design` (see `lbfgs_heads`).
    """
    design = xs if isinstance(xs, Design) else Design(xs)
    obj = SoftmaxHeads(design, targets, num_classes, l2s)
    xt = design.xt
    theta = torch.zeros(xt.shape[0], sum(num_classes), device=xt.device, dtype=xt.dtype)
    for sl, start in zip(obj.slices, init or [], strict=False):
        if start is not None:
            theta[:-1, sl] = start[0].to(theta)
            theta[-1, sl] = start[1].to(theta)
    theta, _ = lbfgs_heads(obj, theta, max_iter=max_iter, tol=tol, memory=memory, precondition=precondition)
    return [(theta[:-1, sl].clone(), theta[-1, sl].clone()) for sl in obj.slices]

