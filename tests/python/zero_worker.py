"""One rank of test_zero.py's runs (under mpirun or torchrun): GPT-2 through ZeRO stage S with N ranks,
rank r training the step's micro-batches j*N + r (the global reduction order); it writes its
losses and every master weight (gathered from the owners) to OUT.rank-R.pt. Optional: SAVE_AT
SAVE_DIR saves a checkpoint after that many steps (and goes on); RESUME_DIR starts from the
checkpoint there, at the step it was saved after (its losses are the remaining steps');
savefail SAVE_DIR FAIL_RANK saves after step 1, then again after step 2 while rank FAIL_RANK's
files may not grow past 1 KiB (RLIMIT_FSIZE: its shard's write fails with EFBIG), and goes on;
what each rank's second save raised is in its output."""
import os
import resource
import signal
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
torch.set_num_threads(1)

import zoffload  # noqa: E402
from models import MAKERS, batches, loss_of  # noqa: E402
from test_models import config  # noqa: E402


def failing_save(eng, save_dir: str, fail: bool) -> str:
    """save_checkpoint with this rank's file size limited to 1 KiB when fail: the error's
    type and message (every rank must raise)."""
    old = resource.getrlimit(resource.RLIMIT_FSIZE)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG from write(), not a signal
    if fail:
        resource.setrlimit(resource.RLIMIT_FSIZE, (1024, old[1]))
    try:
        eng.save_checkpoint(save_dir)
    except Exception as e:  # noqa: BLE001 - the test checks what each rank raised
        return f"{type(e).__name__}: {e}"
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old)
    return ""


def main(stage: int, steps: int, accum: int, out: str, params_home: str, save_at: int = 0,
         save_dir: str = "", resume_dir: str = "", fail_rank: int = -1) -> None:
    cfg = config("bf16", accum=accum, clip=0.3)
    cfg["zero_optimization"]["stage"] = stage
    cfg["zero_optimization"]["offload_param"] = {"device": params_home}
    eng, *_ = zoffload.initialize(model=MAKERS["gpt2"](), config=cfg)
    world, rank = eng.world_size, eng.rank  # as the launcher (mpirun, torchrun) said
    if os.environ.get("ZO_TEST_EXPECT_COMM"):  # the backend the launcher must have chosen
        got = eng.world.comm and zoffload._native.lib().zo_comm_backend(eng.world.comm).decode()
        assert got == os.environ["ZO_TEST_EXPECT_COMM"], (got, os.environ["ZO_TEST_EXPECT_COMM"])
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
        if fail_rank >= 0 and s + 1 == 1:
            eng.save_checkpoint(save_dir)
        if fail_rank >= 0 and s + 1 == 2:
            save_error = failing_save(eng, save_dir, rank == fail_rank)
    # collective: each tensor comes from its owner to every rank
    every = {ep.name: eng.master_weight(ep.name) for ep in eng.params}
    got = {"losses": losses, "weights": every}
    if fail_rank >= 0:
        got["save_error"] = save_error
    torch.save(got, f"{out}.rank-{rank}.pt")
    eng.destroy()


if __name__ == "__main__":
    # STAGE STEPS ACCUM OUT PARAMS [save SAVE_AT SAVE_DIR | resume RESUME_DIR |
    #                              savefail SAVE_DIR FAIL_RANK]
    a = sys.argv[1:]
    extra = {}
    if len(a) > 5 and a[5] == "save":
        extra = {"save_at": int(a[6]), "save_dir": a[7]}
    elif len(a) > 5 and a[5] == "resume":
        extra = {"resume_dir": a[6]}
    elif len(a) > 5 and a[5] == "savefail":
        extra = {"save_dir": a[6], "fail_rank": int(a[7])}
    main(int(a[0]), int(a[1]), int(a[2]), a[3], a[4], **extra)
