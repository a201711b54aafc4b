"""The worked example fine-tunes a Hugging Face directory on a token file with a DeepSpeed
config and saves a directory that transformers loads back with the trained weights."""
import json
import struct
import subprocess
import sys

import torch

from models import VOCAB, llama


def test_finetune_hf_example_saves_a_loadable_trained_model(tmp_path):
    from transformers import AutoModelForCausalLM
    src, out = tmp_path / "model", tmp_path / "out"
    llama().save_pretrained(src)
    ids = [(i * 7 + i // 13) % VOCAB for i in range(4000)]
    (tmp_path / "train.tokens").write_bytes(
        b"ZOTOKENS" + struct.pack("<IIQII", 1, 2, len(ids), VOCAB, 0) +
        struct.pack(f"<{len(ids)}H", *ids))
    (tmp_path / "ds.json").write_text(json.dumps({
        "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
        "bf16": {"enabled": True}, "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
        "zero_optimization": {"offload_optimizer": {"device": "cpu"}}}))
    r = subprocess.run([sys.executable, "-m", "zoffload.examples.finetune_hf", "--hf-model",
                        str(src), "--data", str(tmp_path / "train.tokens"), "--config",
                        str(tmp_path / "ds.json"), "--steps", "12", "--seq", "15", "--save",
                        str(out), "--json"], capture_output=True, text=True,
                       env={**__import__("os").environ,
                            "PYTHONPATH": __import__("os").pathsep.join(sys.path)})
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["last_loss"] < summary["first_loss"]
    before = AutoModelForCausalLM.from_pretrained(src)
    after = AutoModelForCausalLM.from_pretrained(out)
    w0 = before.model.layers[0].mlp.up_proj.weight
    w1 = after.model.layers[0].mlp.up_proj.weight
    assert w1.dtype == torch.float32 and w1.shape == w0.shape
    assert not torch.equal(w0, w1)
