"""A zo-train LLaMA checkpoint loads into the PyTorch front end for the same model (built from
the config.json zo-train writes beside it) and gives zo-train's next-step loss within the
project's bf16 parity limit between zo-train and transformers (1e-3 relative, the loss
limit of tests/train/hf_parity.py, where it measured 6e-5)."""
import json
import os
import struct
import subprocess
from pathlib import Path

import pytest
import torch

import zoffload

ROOT = Path(__file__).resolve().parents[2]
SEQ = 32


def zo_train():
    for d in (os.environ.get("ZOFFLOAD_BUILD_DIR"), ROOT / "build"):
        exe = Path(d or "") / "tools" / "zo-train" / "zo-train"
        if d and exe.exists():
            return str(exe)
    pytest.fail("zo-train is not built (cmake --build build, or set ZOFFLOAD_BUILD_DIR)")


def periodic_tokens(path: Path) -> list:
    """A token stream of period SEQ: every training window (seq+1 tokens at a multiple of seq)
    is the same, so zo-train's next batch is known whatever its shuffle."""
    ids = [(7 * (i % SEQ) + 11) % 256 for i in range(SEQ * 400)]
    path.write_bytes(b"ZOTOKENS" + struct.pack("<IIQII", 1, 2, len(ids), 256, 0) +
                     struct.pack(f"<{len(ids)}H", *ids))
    return ids[:SEQ + 1]


def test_a_zo_train_checkpoint_gives_zo_trains_next_loss(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM
    window = periodic_tokens(tmp_path / "data.tokens")
    common = [zo_train(), "--preset", "tiny", "--data", str(tmp_path / "data.tokens"), "--seq",
              str(SEQ), "--micro-batch", "2", "--offload-optimizer", "cpu", "--offload-param",
              "cpu"]
    ckpt = tmp_path / "ckpt"
    subprocess.run(common + ["--steps", "2", "--save", str(ckpt), "--save-every", "2"],
                   check=True, capture_output=True)
    subprocess.run(common + ["--steps", "3", "--resume", str(ckpt), "--metrics",
                             str(tmp_path / "m.jsonl")], check=True, capture_output=True)
    lines = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines() if x.strip()]
    next_loss = [x for x in lines if x.get("step") == 3][0]["loss"]

    cfg = LlamaConfig.from_pretrained(ckpt / "hf-model")
    cfg._attn_implementation = "eager"
    eng, *_ = zoffload.initialize(model=LlamaForCausalLM(cfg), config={
        "train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True},
        "zero_optimization": {"offload_optimizer": {"device": "cpu"}}})
    eng.load_checkpoint(ckpt)
    x = torch.tensor([window[:SEQ]] * 2)
    y = torch.tensor([window[1:SEQ + 1]] * 2)
    with torch.no_grad():
        logits = eng(input_ids=x).logits
    loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                             y.reshape(-1)).item()
    print(f"zo-train next-step loss {next_loss:.6f}, front end {loss:.6f}")
    assert abs(loss - next_loss) / abs(next_loss) <= 1e-3
    eng.destroy()
