"""A pure-PyTorch reference of what the engine computes, written out here so the tests do not
trust the package: fp32 master weights, the model in the training dtype (its parameters the
masters rounded), micro-batch gradients in that dtype summed in fp32 in micro-batch order,
the global norm in fp64, DeepSpeed's clipping, and Adam/AdamW in fp32 (or fp64 then rounded,
the second reference that measures how far two correct implementations drift apart)."""
from __future__ import annotations

import math
from typing import Callable, Dict, List

import torch
from torch import nn


def unique_params(model: nn.Module):
    seen, out = set(), []
    for n, p in model.named_parameters():
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            out.append((n, p))
    return out


class ReferenceTrainer:
    def __init__(self, model: nn.Module, dtype: torch.dtype, lr=1e-3, betas=(0.9, 0.999),
                 eps=1e-8, weight_decay=0.0, adamw=True, max_norm=0.0, accum=1,
                 math_dtype=torch.float32, decay_of=None, group_of=None):
        self.model = model
        self.params = unique_params(model)
        self.master = {n: p.detach().float().clone() for n, p in self.params}
        self.m = {n: torch.zeros_like(v) for n, v in self.master.items()}
        self.v = {n: torch.zeros_like(v) for n, v in self.master.items()}
        self.dtype, self.lr, self.betas, self.eps = dtype, lr, betas, eps
        self.wd, self.adamw, self.max_norm, self.accum = weight_decay, adamw, max_norm, accum
        self.math = math_dtype
        self.decay_of = decay_of or {}  # parameter name -> its own weight decay
        self.group_of = group_of or {}  # parameter name -> its group's own lr, betas, eps
        self.t = 0
        for m in model.modules():  # buffers in the compute dtype, as the engine casts them
            for k, b in list(m._buffers.items()):
                if b is not None and b.is_floating_point():
                    m._buffers[k] = b.to(dtype)
        self._publish()

    def _publish(self) -> None:
        for n, p in self.params:
            p.data = self.master[n].to(self.dtype)

    def step(self, micro_batches: List, loss_fn: Callable) -> List[float]:
        acc = {n: None for n, _ in self.params}
        losses = []
        for b in micro_batches:
            loss = loss_fn(self.model, b)
            losses.append(loss.item())
            (loss * (1.0 / self.accum) if self.accum != 1 else loss).backward()
            for n, p in self.params:
                g = p.grad.float() if p.grad is not None else torch.zeros_like(self.master[n])
                acc[n] = g if acc[n] is None else acc[n] + g
                p.grad = None
        sum_sq = sum(float((g.double() ** 2).sum()) for g in acc.values())
        norm = math.sqrt(sum_sq)
        combined = 1.0
        if self.max_norm > 0:
            clip = (norm + 1e-6) / self.max_norm
            if clip > 1.0:
                combined = clip
        factor = torch.tensor(1.0 / combined, dtype=torch.float32)
        self.t += 1
        self._adam(acc, factor)
        self._publish()
        self.last_norm = norm
        return losses

    def _adam(self, grads: Dict[str, torch.Tensor], factor: torch.Tensor) -> None:
        """The engine's constants, computed as it computes them (optim/adam.c: hyper-parameters
        held in fp32, bias corrections in double), then the update in self.math."""
        import numpy as np
        T = self.math
        f = np.float32
        c = lambda x: torch.tensor(float(x), dtype=torch.float32).to(T)
        for n, g in grads.items():
            own = self.group_of.get(n, {})
            lr = f(own.get("lr", self.lr))
            b1, b2 = (f(b) for b in own.get("betas", self.betas))
            eps = f(own.get("eps", self.eps))
            bc1 = 1.0 - math.pow(float(b1), self.t)
            bc2 = 1.0 - math.pow(float(b2), self.t)
            step_size = c(f(float(lr) / bc1))
            inv_sqrt_bc2 = c(f(1.0 / math.sqrt(bc2)))
            B1, B2, O1, O2, EPS = c(b1), c(b2), c(f(1.0) - b1), c(f(1.0) - b2), c(eps)
            wd = f(self.decay_of.get(n, self.wd))
            decay = c(f(1.0) - lr * wd) if self.adamw else c(1.0)
            l2 = c(0.0 if self.adamw else wd)
            p, m, v = self.master[n].to(T), self.m[n].to(T), self.v[n].to(T)
            g = g.to(T) * factor.to(T)
            g = g + l2 * p
            m = B1 * m + O1 * g
            v = B2 * v + (O2 * g) * g
            denom = v.sqrt() * inv_sqrt_bc2 + EPS
            p = p * decay - step_size * (m / denom)
            self.master[n], self.m[n], self.v[n] = p.float(), m.float(), v.float()
