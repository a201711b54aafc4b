"""fp16 with DeepSpeed's dynamic loss scaling: the loss is multiplied by the scale in backward,
an overflowing step is skipped (weights and schedule unchanged) and halves the scale after the
hysteresis, and training goes on; a static scale holds."""
import torch

import zoffload
from models import MAKERS, batches, loss_of
from test_models import config


def fp16_config(**fp16):
    cfg = config("fp32")
    cfg["fp16"] = {"enabled": True, **fp16}
    return cfg


def test_dynamic_loss_scale_skips_overflows_and_trains():
    # 2^40 makes fp16 gradients overflow at once: the scaler must come down to a usable scale
    eng, *_ = zoffload.initialize(model=MAKERS["mlp"](),
                                  config=fp16_config(initial_scale_power=40, hysteresis=1))
    assert eng.loss_scale == 2.0 ** 40
    fn = loss_of("mlp", torch.float16)
    before = eng.master_weight("head.0.weight")
    losses, skipped_at = [], []
    for i, b in enumerate(batches("mlp", 40)):
        w = eng.master_weight("head.0.weight")
        loss = fn(eng, b)
        losses.append(loss.item())
        eng.backward(loss)
        eng.step()
        if eng.last_stats.overflow:
            skipped_at.append(i)
            assert torch.equal(eng.master_weight("head.0.weight"), w), "a skipped step moved"
    assert skipped_at and skipped_at[0] == 0, "the first step overflows at 2^40"
    assert eng.skipped_steps == len(skipped_at)
    assert eng.loss_scale < 2.0 ** 40
    assert not torch.equal(eng.master_weight("head.0.weight"), before)
    assert sum(losses[-10:]) < sum(losses[:10])
    eng.destroy()


def test_a_static_loss_scale_holds():
    eng, *_ = zoffload.initialize(model=MAKERS["mlp"](), config=fp16_config(loss_scale=128.0))
    fn = loss_of("mlp", torch.float16)
    for b in batches("mlp", 3):
        loss = fn(eng, b)
        eng.backward(loss)
        eng.step()
        assert eng.last_stats.loss_scale == 128.0 and not eng.last_stats.overflow
    eng.destroy()
