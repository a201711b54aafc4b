"""Bad input gets a clear Python exception naming what is wrong and what would be right, and
the model is left as it was."""
import os

import pytest
import torch
from torch import nn

import zoffload
from test_models import config


def small():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 4))


def test_a_config_key_typo_names_the_key_meant():
    model = small()
    before = [p.detach().clone() for p in model.parameters()]
    cfg = config("bf16")
    cfg["gradient_clippin"] = 1.0
    with pytest.raises(zoffload.ZoConfigError, match="did you mean 'gradient_clipping'"):
        zoffload.initialize(model=model, config=cfg)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    zoffload.initialize(model=model, config=config("bf16"))[0].destroy()  # still usable


def test_sparse_attention_is_zo_trains_only():
    """The section is a block layout of zo-train's fused attention: the front end, which runs
    the model's own attention modules, refuses it instead of training without it."""
    cfg = config("bf16")
    cfg["sparse_attention"] = {"mode": "fixed", "attention": "unidirectional"}
    with pytest.raises(zoffload.ZoConfigError, match="'sparse_attention' is a block layout of "
                       "zo-train's fused attention"):
        zoffload.initialize(model=small(), config=cfg)


def test_a_model_without_parameters_is_refused():
    with pytest.raises(zoffload.ZoArgumentError, match="no trainable parameters"):
        zoffload.initialize(model=nn.Sequential(nn.ReLU()), config=config("bf16"))


class UsesWeightOutside(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(8, 8)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        h = self.inner(x)
        return self.head(h) + nn.functional.linear(h, self.inner.weight).sum(-1, keepdim=True)


def test_a_parameter_used_outside_its_layer_is_named():
    eng, *_ = zoffload.initialize(model=UsesWeightOutside(), config=config("bf16"))
    with pytest.raises(zoffload.ZoArgumentError,
                       match=r"parameter 'inner.weight' is used by linear\(\) outside"):
        eng(torch.randn(2, 8, dtype=torch.bfloat16))
    eng.destroy()


def test_a_second_initialize_on_one_model_is_refused():
    model = small()
    eng, *_ = zoffload.initialize(model=model, config=config("bf16"))
    with pytest.raises(zoffload.ZoStateError, match="already called on this model"):
        zoffload.initialize(model=model, config=config("bf16"))
    eng.destroy()
    zoffload.initialize(model=model, config=config("bf16"))[0].destroy()  # after destroy: fine


def test_step_before_backward_is_refused():
    eng, *_ = zoffload.initialize(model=small(), config=config("bf16"))
    with pytest.raises(zoffload.ZoStateError, match=r"step\(\) called before backward\(\)"):
        eng.step()
    out = eng(torch.randn(2, 8, dtype=torch.bfloat16)).float().pow(2).mean()
    eng.backward(out)
    eng.step()  # the right order works
    with pytest.raises(zoffload.ZoStateError, match="before backward"):
        eng.step()
    eng.destroy()


def test_an_unsupported_client_optimizer_is_named():
    model = small()
    with pytest.raises(zoffload.ZoArgumentError, match="SGD is not supported"):
        zoffload.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                            config={"train_micro_batch_size_per_gpu": 1})


def test_a_torch_adamw_drives_the_engine_adam():
    model = small()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
    eng, zopt, _, _ = zoffload.initialize(model=model, optimizer=opt,
                                          config={"train_micro_batch_size_per_gpu": 1,
                                                  "bf16": {"enabled": True}})
    assert zopt.param_groups[0]["lr"] == pytest.approx(0.01)
    assert zopt.param_groups[0]["weight_decay"] == pytest.approx(0.1)
    eng.destroy()


def test_a_device_budget_below_one_layer_names_the_shortfall():
    cfg = config("bf16", device_mem=1024, chunk_size=4096)
    cfg["zero_optimization"]["offload_param"] = {"device": "cpu"}
    model = small()
    with pytest.raises(zoffload.ZoOutOfMemoryError, match="device tier.*short by"):
        zoffload.initialize(model=model, config=cfg)
    assert all(p.numel() > 0 for p in model.parameters())  # the model keeps its weights


def test_the_engine_reports_what_it_trains_with():
    cfg = config("bf16", accum=2, clip=0.5)
    cfg["optimizer"]["params"]["betas"] = [0.8, 0.95]
    eng, *_ = zoffload.initialize(model=small(), config=cfg)
    e = eng.effective_config()
    assert e["optimizer"]["type"] == "AdamW" and e["optimizer"]["betas"] == [0.8, 0.95]
    assert e["gradient_clipping"] == 0.5 and e["dtype"] == "bf16" and e["loss_scale"] is None
    assert e["batch"] == {"train_batch_size": 4, "micro_batch": 2,
                          "gradient_accumulation_steps": 2, "world_size": 1}
    assert e["offload_optimizer"] == "cpu" and e["zero_stage"] == 0
    assert eng.zoffload_config()["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    eng.destroy()


def test_parameter_groups_with_betas_out_of_range_are_refused():
    """A group may set its own betas (test_groups.py), within [0, 1): others are named."""
    model = small()
    groups = [{"params": [model[0].weight, model[2].weight], "weight_decay": 0.01},
              {"params": [model[0].bias, model[2].bias], "betas": (0.5, 1.5)}]
    with pytest.raises(zoffload.ZoArgumentError,
                       match=r"group 1: betas=\(0.5, 1.5\) must be two numbers in \[0, 1\)"):
        zoffload.initialize(model=model, model_parameters=groups, config=config("bf16"))
    same = [{"params": [model[0].weight, model[2].weight], "weight_decay": 0.01},
            {"params": [model[0].bias, model[2].bias]}]
    zoffload.initialize(model=model, model_parameters=same, config=config("bf16"))[0].destroy()


def test_files_the_package_reads_refuse_fifos(tmp_path):
    """A config file or a checkpoint's trainer_state.json that is a FIFO is refused by name at
    once (the open used to block until a writer came); so is a directory."""
    fifo = tmp_path / "ds_config.json"
    os.mkfifo(fifo)
    with pytest.raises(zoffload.ZoConfigError, match="is a FIFO: expected a regular file"):
        zoffload.initialize(model=small(), config=str(fifo))
    with pytest.raises(zoffload.ZoConfigError, match="is a directory: expected a regular file"):
        zoffload.initialize(model=small(), config=str(tmp_path))
    eng = zoffload.initialize(model=small(), config=config("bf16"))[0]
    try:
        eng.save_checkpoint(str(tmp_path / "ck"), tag="t")
        state = tmp_path / "ck" / "t" / "trainer_state.json"
        state.unlink()
        os.mkfifo(state)
        with pytest.raises(zoffload.ZoError, match="trainer_state.json' is a FIFO"):
            eng.load_checkpoint(str(tmp_path / "ck"), tag="t")
    finally:
        eng.destroy()
