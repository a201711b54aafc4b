"""The launch rendezvous under torchrun meets in torchrun's own store: torchrun's agent serves a
c10d TCPStore on MASTER_PORT (so rank 0 cannot listen there) and says so to its workers
(TORCHELASTIC_USE_AGENT_STORE). Threads play the ranks here, each with its own zo_rank_info,
against a TCPStore this process serves: every rank gets every rank's block in rank order, a
second rendezvous in the same process uses keys of its own, and a rank that never sets its
block is named at the timeout. (test_zero.py's torchrun runs take this path end to end.)"""
import ctypes
import threading

import pytest
from torch.distributed import TCPStore

from zoffload import _native as N


@pytest.fixture
def store(monkeypatch):
    s = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    yield s


def rendezvous(port, rank, n, mine: bytes, timeout_s):
    """(status, error text, every rank's block) for one rank."""
    ri = N.sized(N.RankInfo, rank=rank, world_size=n, local_rank=rank, launcher=b"torchrun",
                 master_addr=b"127.0.0.1", master_port=port)
    out = ctypes.create_string_buffer(len(mine) * n)
    st = N.lib().zo_launch_rendezvous(ctypes.byref(ri), mine, out, len(mine), timeout_s)
    err = N.lib().zo_last_error().decode() if st < 0 else ""
    return st, err, out.raw


def all_ranks(port, n, salt, timeout_s=30.0):
    got = [None] * n

    def one(r):
        got[r] = rendezvous(port, r, n, bytes([salt, r]) * 8, timeout_s)

    ts = [threading.Thread(target=one, args=(r,)) for r in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return got


def test_ranks_meet_in_torchruns_store(store):
    for salt in (7, 9):  # two rendezvous in a row: keys of their own
        got = all_ranks(store.port, 3, salt)
        want = b"".join(bytes([salt, r]) * 8 for r in range(3))
        for st, err, out in got:
            assert st == 0, err
            assert out == want


def test_a_rank_that_never_comes_is_named(store):
    st, err, _ = rendezvous(store.port, 0, 3, b"x" * 16, 1.0)
    assert st < 0
    assert "torchrun's store" in err and "rank(s) 1, 2 did not arrive" in err, err
