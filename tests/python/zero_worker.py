"""One rank of test_zero.py's runs (under mpirun): GPT-2 through ZeRO stage S with N ranks,
rank r training the step's micro-batches j*N + r (the global reduction order); it writes its
losses and every master weight (gathered from the owners) to OUT.rank-R.pt. Optional: SAVE_AT
SAVE_DIR saves a checkpoint after that many steps (and goes on); RESUME_DIR starts from the
checkpoint there, at the step it was saved after (its losses are the remaining steps')."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
torch.set_num_threads(1)

import zoffload  # noqa: E402
from models import MAKERS, batches, loss_of  # noqa: E402
from test_models import config  # noqa: E402


def main(stage: int, steps: int, accum: int, out: str, params_home: str, save_at: int = 0,
         save_dir: str = "", resume_dir: str = "") -> None:
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    cfg = config("bf16", accum=accum, clip=0.3)
    cfg["zero_optimization"]["stage"] = stage
    cfg["zero_optimization"]["offload_param"] = {"device": params_home}
    eng, *_ = zoffload.initialize(model=MAKERS["gpt2"](), config=cfg)
    fn = loss_of("gpt2", torch.bfloat16)
    b = batches("gpt2", steps * accum * world)
    losses = []
    start = 0
    if resume_dir:
        eng.load_checkpoint(resume_dir)
        start = eng.global_steps
    for s in range(start, steps):
        for j in range(accum):
            mb = b[s * accum * world + j * world + rank]
            loss = fn(eng, mb)
            losses.append(loss.item())
            eng.backward(loss)
            eng.step()
        if s + 1 == save_at:
            eng.save_checkpoint(save_dir)
    # collective: each tensor comes from its owner to every rank
    every = {ep.name: eng.master_weight(ep.name) for ep in eng.params}
    torch.save({"losses": losses, "weights": every}, f"{out}.rank-{rank}.pt")
    eng.destroy()


if __name__ == "__main__":
    # STAGE STEPS ACCUM OUT PARAMS [save SAVE_AT SAVE_DIR | resume RESUME_DIR]
    a = sys.argv[1:]
    extra = {}
    if len(a) > 5 and a[5] == "save":
        extra = {"save_at": int(a[6]), "save_dir": a[7]}
    elif len(a) > 5 and a[5] == "resume":
        extra = {"resume_dir": a[6]}
    main(int(a[0]), int(a[1]), int(a[2]), a[3], a[4], **extra)
