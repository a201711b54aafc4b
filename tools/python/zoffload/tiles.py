"""Memory-centric tiling (ZeRO-Infinity's name for it): a weight too large for the device
budget is cut into row tiles, each an engine tensor in a layer of its own, and the modules
using it run tile by tile, so the device holds one tile of it at a time, never the whole.

Which weights: the `weight` of an nn.Embedding (no max_norm, scale_grad_by_freq or sparse)
or of an nn.Linear (its bias frozen or absent), when every unit using the parameter is such
a module holding it as its only trainable parameter: GPT-2's tied wte/lm_head, a LLaMA's
embed_tokens and lm_head. Rows are the vocabulary (Embedding) or the output features
(Linear), so a tile is a slice of the table or of the output columns.

  Embedding  forward: each tile looks up the ids that fall in its rows; backward: each tile's
             gradient is embedding_dense_backward of those positions (rows outside get none).
  Linear     forward: y[..., lo:hi] = x @ W[lo:hi].T (+ the frozen bias's slice); backward:
             dW[lo:hi] = dy[..., lo:hi].T @ x, and dx the sum over tiles of dy[..., lo:hi] @
             W[lo:hi], computed and accumulated in fp32 in tile order (the one result that is
             not the untiled op's bits: its reduction over the output features is split; a
             16-bit product per tile would round once per tile instead of once).

The engine's protocol per tile is the one of layers.py: fetch, compute, release; the owner's
backward hands the tile's gradient over (with what borrowers left for it), a borrower's
backward leaves its part for the owner, as a tied parameter's does.
"""
from __future__ import annotations

import math
from typing import Dict, List, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .layers import Unit

Q8_BLOCK = 256  # the int8 state format's block (elements): tiles hold whole blocks
Q8_MIN_NUMEL = 4096  # ZO_ADAM_Q8_MIN_NUMEL (zo/optim.h): smaller tensors keep fp32 moments


def _tileable_module(m: nn.Module, p: nn.Parameter) -> bool:
    own = [q for q in m.parameters() if q.requires_grad]
    if len(own) != 1 or own[0] is not p or p.dim() != 2:
        return False
    if type(m) is nn.Embedding:
        return m.weight is p and m.max_norm is None and not m.scale_grad_by_freq \
            and not m.sparse
    if type(m) is nn.Linear:
        return m.weight is p
    return False


def tileable(units: Sequence[tuple]) -> List[nn.Parameter]:
    """The trainable parameters every unit using which is a tileable module (see above)."""
    users: Dict[int, list] = {}
    params: Dict[int, nn.Parameter] = {}
    for _, m in units:
        for p in m.parameters():
            if p.requires_grad:
                users.setdefault(id(p), []).append(m)
                params[id(p)] = p
    return [params[k] for k, ms in users.items() if all(_tileable_module(m, params[k]) for m in ms)]


def rows_per_tile(p: nn.Parameter, tile_bytes: int, elem_size: int, min_numel: int) -> int:
    """Rows of p in a tile of at most tile_bytes (at least one row, and at least min_numel
    elements), a multiple of what keeps every tile but the last a whole number of int8 state
    blocks."""
    width = p.numel() // p.shape[0]
    step = Q8_BLOCK // math.gcd(width, Q8_BLOCK)
    rows = max(1, tile_bytes // (width * elem_size), -(-min_numel // width))
    return -(-rows // step) * step if rows % step else rows


def plan(units: Sequence[tuple], tile_bytes: int, elem_size: int,
         int8_states: bool) -> Dict[int, int]:
    """id(param) -> rows per tile for every tileable parameter larger than tile_bytes. With
    int8 states a tile holds at least Q8_MIN_NUMEL elements (the last one too: layers.py
    joins a shorter rest to the tile before it), so that every tile keeps the whole weight's
    state format and a tiled checkpoint is an untiled one."""
    out = {}
    min_numel = Q8_MIN_NUMEL if int8_states else 1
    for p in tileable(units):
        if p.numel() * elem_size > tile_bytes:
            rows = rows_per_tile(p, tile_bytes, elem_size, min_numel)
            width = p.numel() // p.shape[0]
            if p.shape[0] - rows >= -(-min_numel // width):  # two tiles at least
                out[id(p)] = (rows, min_numel)
    return out


class TiledRun(torch.autograd.Function):
    """A tiled unit's forward and backward (the op object does the fetching)."""

    @staticmethod
    def forward(ctx, op, anchor, x):
        ctx.op = op
        ctx.save_for_backward(x)
        return op.forward(x)

    @staticmethod
    def backward(ctx, gy):
        (x,) = ctx.saved_tensors
        return None, None, ctx.op.backward(x, gy)


class TiledOp:
    """What a tiled unit's forward and backward do; eng provides the engine's calls:
    eng._tile_use(ep, backward_owner) (a context giving the tile's weight and, for its
    owner's backward, its gradient slot) and eng._tile_grad(ep, g, owner, slot)."""

    def __init__(self, eng, unit: Unit):
        self.eng, self.unit, self.m = eng, unit, unit.module
        self.embedding = type(unit.module) is nn.Embedding

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embedding:
            return self._embedding_forward(x)
        return self._linear_forward(x)

    def backward(self, x: torch.Tensor, gy: torch.Tensor):
        if self.embedding:
            self._embedding_backward(x, gy)
            return None
        return self._linear_backward(x, gy)

    def _embedding_forward(self, ids: torch.Tensor) -> torch.Tensor:
        m = self.m
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= m.num_embeddings):
            raise IndexError(f"index out of range in self: ids must be in [0, "
                             f"{m.num_embeddings}) for {self.unit.name}")
        out = torch.empty(*ids.shape, m.embedding_dim, dtype=self.eng.torch_dtype,
                          device=ids.device)
        for ep in self.unit.tiles:
            lo, hi = ep.rows
            sel = (ids >= lo) & (ids < hi)
            with self.eng._tile_use(ep, False) as (w, _):
                if bool(sel.any()):
                    out[sel] = F.embedding(ids[sel] - lo, w)
        return out

    def _embedding_backward(self, ids: torch.Tensor, gy: torch.Tensor) -> None:
        pad = self.m.padding_idx
        owner = self.unit.tile_owner
        for ep in reversed(self.unit.tiles):
            lo, hi = ep.rows
            sel = (ids >= lo) & (ids < hi)
            g = None
            if bool(sel.any()):
                p = pad - lo if pad is not None and lo <= pad < hi else -1
                g = torch.ops.aten.embedding_dense_backward(gy[sel], ids[sel] - lo, hi - lo,
                                                            p, False)
            with self.eng._tile_use(ep, owner) as (_, slot):
                self.eng._tile_grad(ep, g, owner, slot)

    def _linear_forward(self, x: torch.Tensor) -> torch.Tensor:
        m = self.m
        out = torch.empty(*x.shape[:-1], m.out_features, dtype=x.dtype, device=x.device)
        for ep in self.unit.tiles:
            lo, hi = ep.rows
            b = m.bias[lo:hi] if m.bias is not None else None
            with self.eng._tile_use(ep, False) as (w, _):
                out[..., lo:hi] = F.linear(x, w, b)
        return out

    def _linear_backward(self, x: torch.Tensor, gy: torch.Tensor) -> torch.Tensor:
        owner = self.unit.tile_owner
        x2 = x.reshape(-1, x.shape[-1])
        gx = torch.zeros(x2.shape, dtype=torch.float32, device=x.device)
        for ep in reversed(self.unit.tiles):
            lo, hi = ep.rows
            g2 = gy[..., lo:hi].reshape(-1, hi - lo)
            with self.eng._tile_use(ep, owner) as (w, slot):
                gx.addmm_(g2.float(), w.float())
                self.eng._tile_grad(ep, g2.t() @ x2, owner, slot)
        return gx.to(x.dtype).view(x.shape)
