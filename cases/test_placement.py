"""Where a rank runs: on the CPU, ranks that outnumber the cores are bound one core each
(``harness.rank.worker._place``); otherwise the scheduler places them as before."""

from __future__ import annotations

import os

import pytest
import torch

from harness.rank import worker

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


@pytest.fixture
def bound(monkeypatch: pytest.MonkeyPatch) -> list[set[int]]:
    """The core sets ranks bind themselves to; the process may use cores 4 and 6."""
    calls: list[set[int]] = []
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {6, 4}, raising=False)
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cores: calls.append(set(cores)), raising=False)
    return calls


def test_four_ranks_on_two_cores_take_one_core_each_in_turn(bound, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    for local_rank in range(4):
        worker._place(CPU, local_rank)
    assert bound == [{4}, {6}, {4}, {6}]


@pytest.mark.parametrize("local_world", ["1", "2"])
def test_ranks_with_a_core_each_are_left_to_the_scheduler(bound, monkeypatch, local_world):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", local_world)
    worker._place(CPU, 0)
    assert bound == []


def test_gpu_ranks_are_not_bound(bound, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    worker._place(CUDA, 3)
    assert bound == []


def test_no_local_world_is_one_rank(bound, monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    worker._place(CPU, 0)
    assert bound == []
