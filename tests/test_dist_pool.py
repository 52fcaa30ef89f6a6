"""Ranks kept for a validation run (``validate.distributed.pool``): jobs share the
processes and their group, a failure ends the pool and the next job starts a new one,
``fresh`` jobs get new ranks (forked from the run's zygote, ``validate.distributed.zygote``),
and nothing outlives it."""

from __future__ import annotations

import os

import pytest
import torch.distributed as dist

from validate.distributed.launch import launch
from validate.distributed.pool import active, pooled


def _pid_and_sum(rank: int, world: int, value: int) -> tuple[int, int]:
    """This rank's process id and the all-reduced sum of ``value + rank``."""
    import torch

    t = torch.tensor([value + rank])
    dist.all_reduce(t)
    return os.getpid(), int(t.item())


def _raise_on_one(rank: int, world: int) -> int:
    if rank == 1:
        raise ValueError("boom on rank 1")
    return rank


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_jobs_share_the_kept_ranks_and_their_group():
    with pooled():
        assert active()
        first = launch(_pid_and_sum, 2, 10, timeout_s=120)
        second = launch(_pid_and_sum, 2, 20, timeout_s=120)
        fresh = launch(_pid_and_sum, 2, 30, timeout_s=120, fresh=True)
        again = launch(_pid_and_sum, 2, 40, timeout_s=120, fresh=True)
    assert not active()
    assert [s for _, s in again] == [81, 81]
    assert not {p for p, _ in again} & {p for p, _ in fresh}  # each fresh job, new ranks
    assert [s for _, s in first] == [21, 21] and [s for _, s in second] == [41, 41]
    kept = [p for p, _ in first]
    assert [p for p, _ in second] == kept  # the same two processes ran both jobs
    assert not set(p for p, _ in fresh) & set(kept)  # a fresh job has its own
    assert [s for _, s in fresh] == [61, 61]
    assert all(_gone(p) for p in kept)  # the pool ended with its context


def test_a_failed_job_ends_the_pool_and_the_next_starts_another():
    with pooled():
        before = [p for p, _ in launch(_pid_and_sum, 2, 0, timeout_s=120)]
        with pytest.raises(RuntimeError, match=r"(?s)rank 1 failed:.*boom on rank 1"):
            launch(_raise_on_one, 2, timeout_s=120)
        after = launch(_pid_and_sum, 2, 5, timeout_s=120)
    assert [s for _, s in after] == [11, 11]
    assert not set(before) & {p for p, _ in after}
    assert all(_gone(p) for p in before)


def _die_on_one(rank: int, world: int) -> int:
    if rank == 1:
        os._exit(3)
    return rank


def test_a_fresh_rank_that_dies_is_a_clear_error_and_the_next_fresh_job_runs():
    with pooled():
        with pytest.raises(RuntimeError, match=r"rank 1 (died \(exit code 3\)|failed)"):
            launch(_die_on_one, 2, timeout_s=30, fresh=True)
        after = launch(_pid_and_sum, 2, 1, timeout_s=120, fresh=True)
    assert [s for _, s in after] == [3, 3]
