"""One rank of test_zero.py's runs (under mpirun): GPT-2 through ZeRO stage S with N ranks,
rank r training the step's micro-batches j*N + r (the global reduction order); it writes its
losses and every master weight (gathered from the owners) to OUT.rank-R.pt."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
torch.set_num_threads(1)

import zoffload  # noqa: E402
from models import MAKERS, batches, loss_of  # noqa: E402
from test_models import config  # noqa: E402


def main(stage: int, steps: int, accum: int, out: str, params_home: str) -> None:
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    cfg = config("bf16", accum=accum, clip=0.3)
    cfg["zero_optimization"]["stage"] = stage
    cfg["zero_optimization"]["offload_param"] = {"device": params_home}
    eng, *_ = zoffload.initialize(model=MAKERS["gpt2"](), config=cfg)
    fn = loss_of("gpt2", torch.bfloat16)
    b = batches("gpt2", steps * accum * world)
    losses = []
    for s in range(steps):
        for j in range(accum):
            mb = b[s * accum * world + j * world + rank]
            loss = fn(eng, mb)
            losses.append(loss.item())
            eng.backward(loss)
            eng.step()
    # collective: each tensor comes from its owner to every rank
    every = {ep.name: eng.master_weight(ep.name) for ep in eng.params}
    torch.save({"losses": losses, "weights": every}, f"{out}.rank-{rank}.pt")
    eng.destroy()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
