"""Fine-tune a Hugging Face causal LM directory on a ZOTOKENS file with a DeepSpeed config,
through zoffload's engine, and save the result as a Hugging Face directory.

    python -m zoffload.examples.finetune_hf --hf-model MODEL_DIR --data train.tokens \\
        --config ds_config.json --steps 200 --seq 512 --save out_dir

MODEL_DIR holds config.json and the weights (safetensors) that transformers'
from_pretrained reads; train.tokens is the token file zo-train reads (tools/data/
prepare_tokens.py makes one from text with the model's tokenizer). Training windows are
seq+1 tokens starting at multiples of seq, visited in an order reshuffled every epoch from
--seed, as in zo-train. Progress goes to stderr; --json prints one JSON summary at the end.
"""
from __future__ import annotations

import argparse
import json
import struct
import sys
import time

MAGIC = b"ZOTOKENS"


def read_tokens(path: str):
    """The ids of a ZOTOKENS file (tools/zo-train/README.md), checked as zo-train checks them."""
    import numpy as np
    from zoffload import _native
    with _native.open_input(path, "--data", binary=True) as f:
        head = f.read(32)
        if len(head) != 32 or head[:8] != MAGIC:
            raise SystemExit(f"{path}: not a ZOTOKENS file (make one with "
                             f"tools/data/prepare_tokens.py)")
        version, width, count, vocab, _ = struct.unpack("<IIQII", head[8:])
        if version != 1 or width not in (2, 4):
            raise SystemExit(f"{path}: version {version}, {width}-byte ids: expected version 1 "
                             f"with 2- or 4-byte ids")
        ids = np.frombuffer(f.read(count * width), dtype="<u2" if width == 2 else "<u4")
    if len(ids) != count:
        raise SystemExit(f"{path}: the header says {count} ids, the file holds {len(ids)}")
    return ids.astype(np.int64), vocab


def windows(ids, seq: int, micro: int, seed: int):
    """Micro-batches of seq+1-token windows, reshuffled every epoch."""
    import numpy as np
    import torch
    starts = np.arange(0, len(ids) - seq - 1, seq)
    if len(starts) < micro:
        raise SystemExit(f"the token file holds {len(starts)} windows of {seq + 1} tokens, fewer "
                         f"than one micro-batch of {micro}: use a shorter --seq or more data")
    rng = np.random.default_rng(seed)
    while True:
        order = rng.permutation(starts)
        for i in range(0, len(order) - micro + 1, micro):
            rows = np.stack([ids[s:s + seq + 1] for s in order[i:i + micro]])
            t = torch.from_numpy(rows)
            yield {"input_ids": t[:, :-1], "labels": t[:, :-1].clone()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m zoffload.examples.finetune_hf",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hf-model", required=True, help="a Hugging Face model directory")
    p.add_argument("--data", required=True, help="a ZOTOKENS token file")
    p.add_argument("--config", required=True, help="a DeepSpeed JSON config")
    p.add_argument("--steps", type=int, default=100, help="optimizer steps")
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--save", help="write the fine-tuned model here (save_pretrained)")
    p.add_argument("--checkpoint", help="also save a zoffload checkpoint here at the end")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--json", action="store_true", help="print one JSON summary")
    a = p.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM

    import zoffload
    ids, vocab = read_tokens(a.data)
    model = AutoModelForCausalLM.from_pretrained(a.hf_model, torch_dtype=torch.float32)
    if vocab > model.config.vocab_size:
        raise SystemExit(f"{a.data}: vocabulary {vocab} exceeds the model's "
                         f"{model.config.vocab_size}: the token file is another tokenizer's")
    eng, _, _, _ = zoffload.initialize(model=model, model_parameters=model.parameters(),
                                       config=a.config)
    print(eng.plan_summary(), file=sys.stderr)
    batches = windows(ids, a.seq, eng.train_micro_batch_size_per_gpu(), a.seed)
    t0, losses, first = time.perf_counter(), [], None
    for step in range(1, a.steps + 1):
        step_loss = 0.0
        for _ in range(eng.gradient_accumulation_steps()):
            loss = eng(**next(batches)).loss
            eng.backward(loss)
            eng.step()
            step_loss += loss.item() / eng.gradient_accumulation_steps()
        first = step_loss if first is None else first
        losses.append(step_loss)
        if step % a.log_every == 0 or step == a.steps:
            done = time.perf_counter() - t0
            toks = step * eng.train_batch_size() * a.seq
            print(f"step {step}/{a.steps}  loss {step_loss:.4f}  lr {eng.get_lr()[0]:.3g}  "
                  f"grad norm {eng.get_global_grad_norm():.3f}  {toks / done:.0f} tokens/s",
                  file=sys.stderr)
    if a.checkpoint:
        eng.save_checkpoint(a.checkpoint)
    elapsed = time.perf_counter() - t0
    if a.save:
        eng.export_to_model().save_pretrained(a.save)
        print(f"saved {a.save}", file=sys.stderr)
    summary = {"steps": a.steps, "first_loss": first, "last_loss": losses[-1],
               "seconds": elapsed, "saved": a.save}
    if a.json:
        print(json.dumps(summary))
    else:
        print(f"loss {first:.4f} -> {losses[-1]:.4f} in {a.steps} steps, {elapsed:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
