"""How a PyTorch model is cut into the engine's layers, and the hooks that page them.

A *unit* is a module whose whole subtree runs as one step of the engine's protocol: its
forward fetches what it needs, its backward fetches again and hands its gradients over.
Units are found from the module tree (find_units) or given by the user; every parameter
belongs to the first unit, in module order, that holds it (its *owner*), and each unit that
owns parameters is one engine layer, in that order. A unit that uses a parameter it does not
own (GPT-2's lm_head uses wte's weight) fetches the owner's layer too: a tied parameter is
one engine tensor.

Three ways of running a unit, chosen per engine:
  direct     every parameter chunk has a device slot of its own (the plan's resident case):
             slots never move, so autograd's saved tensors stay valid and the unit runs as
             PyTorch runs it; gradients arrive through post-accumulate-grad hooks and are
             handed to the engine layer by layer, in reverse layer order.
  refetch    slots are reused (a device budget below the model), and no unit uses another
             layer's untiled parameter: units run as in direct mode, but what autograd saves
             from a parameter's slot is kept as a reference (saved-tensor hooks), and the
             backward's first use fetches the layer again and makes the same view of its slot
             there; the layer is released once all of its parameters' gradients are in, and
             handed over as in direct mode. Activations are kept as PyTorch keeps them (as
             DeepSpeed's ZeRO-3 does without activation checkpointing); nothing is recomputed.
  recompute  slots are reused, and refetch does not apply (a tied untiled parameter, or
             `zoffload.recompute`): the unit's forward runs
             without saving activations (only its inputs), and its backward fetches the layer
             again, recomputes the forward with autograd on, and writes the parameters'
             gradients straight into the engine's gradient buffers: per-layer activation
             checkpointing, as torch.utils.checkpoint does, with the engine fetching for the
             recompute. RNG state is replayed so dropout recomputes the same mask.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from .errors import ZoArgumentError


@dataclass
class EngineParam:
    """One engine tensor: a trainable parameter (by identity) of the model."""
    param: nn.Parameter
    name: str            # its name in model.named_parameters() (the first, when tied)
    layer: int           # the engine layer (owner unit) holding it
    id: int = -1         # the engine's tensor id, after registration
    numel: int = 0
    shape: tuple = ()
    index: int = 0       # its position within its layer (the fetch arrays' index)
    rows: Optional[Tuple[int, int]] = None  # a tile: rows [lo, hi) of param (tiles.py)

    @property
    def param_name(self) -> str:
        """The parameter's name (a tile's name adds its rows: "wte.weight[0:2048]")."""
        return self.name if self.rows is None else self.name.rsplit("[", 1)[0]


@dataclass
class Unit:
    module: nn.Module
    name: str
    layer: Optional[int]                       # the engine layer it owns, or None
    owned: List[EngineParam] = field(default_factory=list)
    borrowed: List[EngineParam] = field(default_factory=list)
    needs: List[int] = field(default_factory=list)  # layers fetched around it, own first
    tiles: List[EngineParam] = field(default_factory=list)  # a tiled unit's weight tiles
    tile_owner: bool = False                   # ... and whether it owns them (else borrows)


def _trainable(m: nn.Module, recurse: bool) -> List[nn.Parameter]:
    return [p for p in m.parameters(recurse=recurse) if p.requires_grad]


def _count(m: nn.Module) -> int:
    seen, n = set(), 0
    for p in _trainable(m, True):
        if id(p) not in seen:
            seen.add(id(p))
            n += p.numel()
    return n


def find_units(model: nn.Module, max_unit_params: Optional[int] = None) -> List[tuple]:
    """(name, module) of each unit, in module order: a module is a unit when it holds
    trainable parameters of its own (they can only be fetched around its forward), has no
    child holding any, or holds at most max_unit_params (default: a 16th of the model, so the
    embedding is one unit); an element of a ModuleList (a transformer's block) is one unit up
    to four times that, so that its residual stream and attention stay together."""
    total = _count(model)
    limit = max_unit_params if max_unit_params else max(1, total // 16)
    units: List[tuple] = []

    def visit(m: nn.Module, name: str, in_list: bool) -> None:
        n = _count(m)
        if n == 0:
            return
        kids = [(k, c) for k, c in m.named_children() if _count(c) > 0]
        if _trainable(m, False) or not kids or n <= (4 * limit if in_list else limit):
            units.append((name, m))
            return
        for k, c in kids:
            visit(c, f"{name}.{k}" if name else k, isinstance(m, nn.ModuleList))

    visit(model, "", False)
    return units


def assign(model: nn.Module, units: Sequence[tuple], layer_bytes: int = 0,
           elem_size: int = 2, tile_rows: Optional[Dict[int, int]] = None) -> tuple:
    """(units, layers, params): owners, layers and the engine tensors for the given units.
    Consecutive units share one engine layer while their parameters fit layer_bytes together
    (0: a layer per unit): the engine packs a layer into whole chunks of at least the largest
    tensor's size, so a layer per transformer block beside a large embedding would leave most
    of every chunk empty. A parameter in tile_rows (id -> (rows per tile, least elements of
    a tile), from tiles.plan) is
    cut into row tiles, each an engine tensor in a layer of its own, where its first user
    stands. Refuses a unit list that leaves a trainable parameter outside every unit, or nests
    one unit inside another."""
    tile_rows = tile_rows or {}
    names: Dict[int, str] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), n)  # a tied parameter goes by its first name (HF's)
    mods = [m for _, m in units]
    for i, a in enumerate(mods):
        for b in mods[i + 1:]:
            if any(x is b for x in a.modules()) or any(x is a for x in b.modules()):
                raise ZoArgumentError(f"layers {units[i][0]!r} and "
                                      f"{units[mods.index(b)][0]!r} nest: give modules whose "
                                      f"subtrees do not overlap")
    owner: Dict[int, EngineParam] = {}
    tiled: Dict[int, List[EngineParam]] = {}
    out: List[Unit] = []
    layers: List[List[EngineParam]] = []
    fill = 0  # bytes in the newest layer
    solo = _beside_tiles(units, tile_rows)
    for name, m in units:
        u = Unit(module=m, name=name or type(m).__name__, layer=None)
        mine = []
        for p in _trainable(m, True):
            if id(p) in tile_rows:
                if id(p) not in tiled:
                    tiled[id(p)] = _tile_layers(p, names.get(id(p), "?"), tile_rows[id(p)],
                                                layers)
                    u.tile_owner = True
                    fill = layer_bytes  # the next unit starts a layer of its own
                u.tiles = tiled[id(p)]
            elif id(p) in owner:
                if all(q.param is not p for q in u.borrowed):
                    u.borrowed.append(owner[id(p)])
            elif all(q is not p for q in mine):
                mine.append(p)
        if mine:
            size = sum(p.numel() for p in mine) * elem_size
            if not layers or not layer_bytes or fill + size > layer_bytes or name in solo:
                layers.append([])
                fill = 0
            u.layer = len(layers) - 1
            fill += layer_bytes if name in solo else size
            for p in mine:
                ep = EngineParam(param=p, name=names.get(id(p), "?"), layer=u.layer,
                                 numel=p.numel(), shape=tuple(p.shape),
                                 index=len(layers[u.layer]))
                owner[id(p)] = ep
                layers[u.layer].append(ep)
                u.owned.append(ep)
        u.borrowed = [q for q in u.borrowed if q.layer != u.layer]
        u.needs = ([u.layer] if u.layer is not None else []) + \
            sorted({q.layer for q in u.borrowed} - {u.layer})
        out.append(u)
    missing = [n for n, p in model.named_parameters()
               if p.requires_grad and id(p) not in owner and id(p) not in tiled]
    if missing:
        raise ZoArgumentError(f"parameter {missing[0]!r} is in no layer"
                              f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}"
                              f": every trainable parameter must sit inside one of the layers "
                              f"given (pass modules that cover the model, or let zoffload "
                              f"choose them)")
    params = [ep for layer in layers for ep in layer]
    return out, layers, params


def _beside_tiles(units: Sequence[tuple], tile_rows: Dict[int, int]) -> set:
    """Names of the units whose parent module also holds a tiled unit somewhere below it.
    They get a layer each: module order is not execution order among siblings (a LLaMA block
    lists its projections before its norms), and a layer shared across a tiled unit would
    stay open for its backward while the tiles are fetched."""
    above = set()
    for name, m in units:
        if any(id(p) in tile_rows for p in _trainable(m, True)):
            parts = name.split(".")
            above.update(".".join(parts[:i]) for i in range(len(parts)))
    return {name for name, _ in units if name.rpartition(".")[0] in above}


def tile_bounds(n_rows: int, width: int, rows: int, min_numel: int) -> List[Tuple[int, int]]:
    """Row ranges of `rows` rows; a rest below min_numel elements joins the tile before it."""
    out = []
    for lo in range(0, n_rows, rows):
        hi = min(lo + rows, n_rows)
        if out and (hi - lo) * width < min_numel:
            out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


def _tile_layers(p: nn.Parameter, name: str, how: Tuple[int, int],
                 layers: List[List[EngineParam]]) -> List[EngineParam]:
    """p's row tiles (how: rows per tile, least elements of a tile), each a new layer."""
    out = []
    width = p.numel() // p.shape[0]
    for lo, hi in tile_bounds(p.shape[0], width, how[0], how[1]):
        ep = EngineParam(param=p, name=f"{name}[{lo}:{hi}]", layer=len(layers),
                         numel=(hi - lo) * width, shape=(hi - lo,) + tuple(p.shape[1:]),
                         rows=(lo, hi))
        layers.append([ep])
        out.append(ep)
    return out


class RngState:
    """The CPU (and current CUDA device's) generator state, to replay a forward's dropout."""

    def __init__(self, cuda: bool):
        self.cpu = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state() if cuda else None

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state(self.cuda)


def split_tensors(args: tuple, kwargs: dict):
    """Flatten (args, kwargs): the tensors, and what rebuilds the structure around them."""
    flat, spec = tree_flatten((args, kwargs))
    idx = [i for i, x in enumerate(flat) if isinstance(x, torch.Tensor)]
    return [flat[i] for i in idx], (flat, spec, idx)


def join_tensors(tensors: Sequence[torch.Tensor], how) -> tuple:
    flat, spec, idx = how
    flat = list(flat)
    for i, t in zip(idx, tensors):
        flat[i] = t
    return tree_unflatten(flat, spec)


class UnitRun(torch.autograd.Function):
    """One unit's forward without saved activations, its backward by recomputation
    (the recompute mode in the module's comment). The engine object does the fetching."""

    @staticmethod
    def forward(ctx, runner, box, anchor, *tensors):
        ctx.runner = runner
        ctx.rng = RngState(runner.cuda_rng)
        args, kwargs = join_tensors(tensors, box["in"])
        out = runner.run_forward(args, kwargs)
        flat, spec = tree_flatten(out)
        idx = [i for i, x in enumerate(flat) if isinstance(x, torch.Tensor)]
        box["out"] = (flat, spec, idx)
        ctx.box = box
        ctx.save_for_backward(*tensors)
        outs = tuple(flat[i] for i in idx)
        for i, o in enumerate(outs):  # never hand autograd an input back as an output
            if any(o is t for t in tensors):
                outs = outs[:i] + (o.view_as(o),) + outs[i + 1:]
        return outs

    @staticmethod
    def backward(ctx, *grad_outs):
        saved = ctx.saved_tensors
        inputs = [t.detach().requires_grad_(t.requires_grad and t.is_floating_point())
                  for t in saved]
        args, kwargs = join_tensors(inputs, ctx.box["in"])
        want = [t for t in inputs if t.requires_grad]
        in_grads = ctx.runner.run_backward(args, kwargs, ctx.rng, grad_outs, want)
        it = iter(in_grads)
        return (None, None, None) + tuple(next(it) if t.requires_grad else None for t in inputs)


def outputs_and_grads(out, grad_outs):
    """The output tensors that need a gradient, paired with the incoming gradients."""
    flat = [x for x in tree_flatten(out)[0] if isinstance(x, torch.Tensor)]
    outs, grads = [], []
    for o, g in zip(flat, grad_outs):
        if g is not None and o.requires_grad:
            outs.append(o)
            grads.append(g)
    return outs, grads
