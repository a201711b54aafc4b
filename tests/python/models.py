"""The models the front end's tests train: two transformers families (GPT-2: tied embeddings,
LayerNorm, biases, a family zo-train does not have; LLaMA: RMSNorm, GQA, RoPE) and a small
non-transformer (an MLP over conv features), all random and tiny, and their batches."""
from __future__ import annotations

import torch
from torch import nn

VOCAB, SEQ = 96, 16


def gpt2(layers: int = 2, width: int = 64):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(1234)
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=width, n_layer=layers, n_head=4,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                     attn_implementation="eager")
    return GPT2LMHeadModel(cfg)


def llama(layers: int = 2, width: int = 64):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(1234)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=width, intermediate_size=2 * width,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=SEQ, attn_implementation="eager",
                      tie_word_embeddings=False)
    return LlamaForCausalLM(cfg)


class ConvMLP(nn.Module):
    """A conv feature extractor, then an MLP head: nothing transformer-like."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1234)
        self.features = nn.Sequential(nn.Conv1d(4, 16, 3, padding=1), nn.GELU(),
                                      nn.Conv1d(16, 16, 3, padding=1), nn.GELU())
        self.head = nn.Sequential(nn.Linear(16 * SEQ, 64), nn.GELU(), nn.Linear(64, 64),
                                  nn.GELU(), nn.Linear(64, 10))

    def forward(self, x, y):
        h = self.features(x).flatten(1)
        logits = self.head(h)
        return nn.functional.cross_entropy(logits.float(), y)


def mlp():
    return ConvMLP()


MAKERS = {"gpt2": gpt2, "llama": llama, "mlp": mlp}


def batches(kind: str, n: int, micro: int = 2, seed: int = 7):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        # Learnable data, so that a test can ask that the loss falls: counting sequences
        # (each token the previous plus a stride), and classes a fixed projection decides.
        if kind == "mlp":
            x = torch.randn(micro, 4, SEQ, generator=g)
            y = (x[:, 0].sum(-1) > 0).long() + 2 * (x[:, 1].sum(-1) > 0).long()
            out.append({"x": x, "y": y})
        else:
            start = torch.randint(0, VOCAB, (micro, 1), generator=g)
            stride = torch.randint(1, 4, (micro, 1), generator=g)
            ids = (start + stride * torch.arange(SEQ)) % VOCAB
            out.append({"input_ids": ids, "labels": ids})
    return out


def loss_of(kind: str, dtype: torch.dtype):
    def fn(model, b):
        if kind == "mlp":
            return model(b["x"].to(dtype), b["y"])
        return model(**b).loss
    return fn
