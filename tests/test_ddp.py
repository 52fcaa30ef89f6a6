"""Data-parallel wrappers and ZeRO-1 on 2 gloo processes match single-process training; the
launcher's failures (a rank that raises, dies or hangs; a killed parent) end cleanly."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from validate.distributed.checks import reference_params
from validate.distributed.launch import launch

STEPS = 4


@pytest.fixture(scope="module")
def reference():
    return reference_params(STEPS)


@pytest.mark.parametrize("variant", ["naive", "flat", "overlap", "bucketed"])
def test_ddp_matches_single_process(variant, reference):
    from validate.distributed.checks import ddp_params

    results = launch(ddp_params, 2, variant, STEPS, False, timeout_s=120)
    for result in results:  # every rank ends with the single-process parameters
        assert len(result["params"]) == len(reference)  # the tied weight is one parameter
        for got, want in zip(result["params"], reference, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_sharded_optimizer_matches_and_halves_state(reference):
    from validate.distributed.checks import ddp_params

    results = launch(ddp_params, 2, "flat", STEPS, True, timeout_s=120)
    for result in results:
        for got, want in zip(result["params"], reference, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    trainable = sum(p.numel() for p in reference) - 32 * 32 - 32  # the frozen layer
    full = 2 * 4 * trainable  # AdamW: two fp32 states per trainable parameter
    states = [r["state_bytes"] for r in results]
    assert sum(states) == full
    assert max(states) - min(states) <= 0.2 * full  # greedy shards of nearly equal size


def _raise(rank, world):
    if rank == 1:
        raise ValueError("boom on rank 1")
    return rank


def _hang(rank, world):
    if rank == 1:
        import time

        time.sleep(60)
    return rank


def _die(rank, world):
    if rank == 1:
        import os

        os._exit(3)
    return rank


def test_a_failing_rank_is_a_clear_error():
    with pytest.raises(RuntimeError, match=r"(?s)rank 1 failed:.*boom on rank 1"):
        launch(_raise, 2, timeout_s=60)


def test_a_dead_rank_ends_the_launch():
    with pytest.raises(RuntimeError, match=r"rank 1 died \(exit code 3\)"):
        launch(_die, 2, timeout_s=60)


def test_a_hung_rank_times_out():
    with pytest.raises(TimeoutError, match=r"rank\(s\) \[1\] did not finish within 5 s"):
        launch(_hang, 2, timeout_s=5)


def test_buckets_fill_in_backward_order_up_to_the_limit():
    from costmodel.parallel.collectives import bucket_indices

    mib = 2**20
    # reversed sizes: 3, 1, 1, 2 MiB -> [3] (alone: over the 2 MiB limit), [1, 1], [2]
    assert bucket_indices([2 * mib, mib, mib, 3 * mib], 2) == [[0], [1, 2], [3]]
    assert bucket_indices([mib] * 4, 100) == [[0, 1, 2, 3]]


def _gone(pid: int) -> bool:
    """No such process, or a zombie nobody has reaped yet (it no longer runs)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not Path("/proc").exists(), reason="reads /proc")
def test_killing_the_parent_leaves_no_ranks_or_folders(tmp_path):
    """SIGKILL the launching process while rank 1 hangs and rank 0 waits at the barrier:
    both ranks notice, remove the job folder and exit (no wall-clock limit on startup)."""
    script = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from test_ddp import _hang\n"
        "from validate.distributed.launch import launch\n"
        "launch(_hang, 2, timeout_s=600)\n"
    )
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    parent = subprocess.Popen([sys.executable, "-c", script], env=env)
    try:
        ready = []
        while len(ready) < 2:  # bounded by the launch's own startup limit, not a clock here
            assert parent.poll() is None, "the launching process ended early"
            ready = list(tmp_path.glob("costmodel-dist-*/*.ready"))
            time.sleep(0.2)
        pids = [int(p.read_text()) for p in ready]
    finally:
        parent.kill()
        parent.wait()
    for _ in range(300):  # up to 60 s; a rank checks on its parent every 0.2 s
        if all(_gone(pid) for pid in pids) and not list(tmp_path.glob("costmodel-dist-*")):
            break
        time.sleep(0.2)
    assert all(_gone(pid) for pid in pids), "a rank outlived its killed parent"
    assert not list(tmp_path.glob("costmodel-dist-*")), "the job folder was left behind"
