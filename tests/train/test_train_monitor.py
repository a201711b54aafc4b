"""zo-train writes DeepSpeed's csv_monitor and tensorboard sections: a CSV file per figure
holding every step's value (the same as the --metrics lines), and a TensorBoard event file
whose TFRecord framing (masked CRC-32C of length and record) and Event protocol buffers a
reader written here decodes to the same values. Run by ctest: test_train_monitor.py ZO_TRAIN."""
import csv
import json
import os
import struct
import subprocess
import sys
import tempfile


def crc32c(data: bytes) -> int:
    c = 0xFFFFFFFF
    for b in data:
        c ^= b
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    return c ^ 0xFFFFFFFF


def masked(data: bytes) -> int:
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def varint(b: bytes, i: int):
    v = s = 0
    while True:
        x = b[i]
        i += 1
        v |= (x & 0x7F) << s
        s += 7
        if x < 0x80:
            return v, i


def fields(b: bytes):
    """(field, wire type, value) of one protocol buffer message."""
    i = 0
    while i < len(b):
        key, i = varint(b, i)
        f, w = key >> 3, key & 7
        if w == 0:
            v, i = varint(b, i)
        elif w == 1:
            v, i = b[i:i + 8], i + 8
        elif w == 5:
            v, i = b[i:i + 4], i + 4
        elif w == 2:
            n, i = varint(b, i)
            v, i = b[i:i + n], i + n
        else:
            raise AssertionError(f"wire type {w}")
        yield f, w, v


def read_events(path: str):
    data = open(path, "rb").read()
    i, events = 0, []
    while i < len(data):
        head = data[i:i + 8]
        (n,) = struct.unpack("<Q", head)
        assert struct.unpack("<I", data[i + 8:i + 12])[0] == masked(head), "length CRC"
        rec = data[i + 12:i + 12 + n]
        assert struct.unpack("<I", data[i + 12 + n:i + 16 + n])[0] == masked(rec), "record CRC"
        i += 16 + n
        ev = {"values": {}}
        for f, w, v in fields(rec):
            if f == 2:
                ev["step"] = v
            elif f == 3:
                ev["file_version"] = v.decode()
            elif f == 5:
                for _, _, val in fields(v):
                    kv = dict((ff, vv) for ff, _, vv in fields(val))
                    ev["values"][kv[1].decode()] = struct.unpack("<f", kv[2])[0]
        events.append(ev)
    return events


def main(zo_train: str) -> int:
    with tempfile.TemporaryDirectory() as d:
        cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
               "bf16": {"enabled": True},
               "tensorboard": {"enabled": True, "output_path": f"{d}/tb", "job_name": "job"},
               "csv_monitor": {"enabled": True, "output_path": f"{d}/csv", "job_name": "job"}}
        with open(f"{d}/ds.json", "w") as f:
            json.dump(cfg, f)
        subprocess.run([zo_train, "--config", f"{d}/ds.json", "--steps", "4", "--seq", "32",
                        "--offload-optimizer", "cpu", "--metrics", f"{d}/m.jsonl"], check=True,
                       capture_output=True)
        metrics = [json.loads(x) for x in open(f"{d}/m.jsonl") if x.strip()]
        loss = list(csv.reader(open(f"{d}/csv/job/Train_Samples_train_loss.csv")))
        assert loss[0] == ["step", "Train/Samples/train_loss"], loss[0]
        assert [int(r[0]) for r in loss[1:]] == [4, 8, 12, 16], "samples seen"
        assert [float(r[1]) for r in loss[1:]] == [m["loss"] for m in metrics]
        norm = list(csv.reader(open(f"{d}/csv/job/Train_Samples_grad_norm.csv")))
        assert [float(r[1]) for r in norm[1:]] == [m["grad_norm"] for m in metrics]
        files = os.listdir(f"{d}/tb/job")
        assert len(files) == 1 and files[0].startswith("events.out.tfevents."), files
        events = read_events(f"{d}/tb/job/{files[0]}")
        assert events[0].get("file_version") == "brain.Event:2"
        steps = events[1:]
        assert [e["step"] for e in steps] == [4, 8, 12, 16]
        for e, m in zip(steps, metrics):
            assert abs(e["values"]["Train/Samples/train_loss"] - m["loss"]) <= 1e-6 * abs(m["loss"])
            assert abs(e["values"]["Train/Samples/lr"] - m["lr"]) <= 1e-6 * abs(m["lr"])
    print("test_train_monitor: csv and tensorboard match the metrics of 4 steps")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
