"""LR schedules with Psyche's names and fields."""

import pytest

from psyche_worker.protocol import WorkerError
from psyche_worker.schedule import schedule_from_config


def test_warmup_is_linear_from_init_to_base():
    s = schedule_from_config({"Constant": {"base_lr": 1.0, "warmup_steps": 10, "warmup_init_lr": 0.0}})
    assert [s(i) for i in (0, 5, 10, 100)] == [0.0, 0.5, 1.0, 1.0]


def test_linear_and_cosine_reach_final_lr_at_total_steps():
    lin = schedule_from_config({"Linear": {"base_lr": 1.0, "warmup_steps": 0, "warmup_init_lr": 0.0, "total_steps": 100, "final_lr": 0.1}})
    cos = schedule_from_config({"Cosine": {"base_lr": 1.0, "warmup_steps": 10, "warmup_init_lr": 0.0, "total_steps": 110, "final_lr": 0.1}})
    assert lin(50) == pytest.approx(0.55) and lin(100) == pytest.approx(0.1) and lin(1000) == pytest.approx(0.1)
    assert cos(10) == pytest.approx(1.0) and cos(60) == pytest.approx(0.55) and cos(110) == pytest.approx(0.1)


def test_warmup_stable_decay_phases():
    s = schedule_from_config(
        {
            "WarmupStableDecay": {
                "warmup_steps": 10,
                "warmup_init_lr": 0.0,
                "base_lr": 2.0,
                "stable_steps": 20,
                "cosine_decay_steps": 10,
                "cosine_decay_final_lr": 1.0,
                "linear_decay_steps": 10,
                "linear_decay_final_lr": 0.0,
            }
        }
    )
    assert s(5) == pytest.approx(1.0)  # warmup
    assert s(25) == pytest.approx(2.0)  # stable
    assert s(35) == pytest.approx(1.5)  # halfway down the cosine
    assert s(40) == pytest.approx(1.0)  # cosine done
    assert s(45) == pytest.approx(0.5)  # halfway down the linear tail
    assert s(60) == pytest.approx(0.0)


def test_bad_schedules_name_the_problem():
    with pytest.raises(WorkerError, match="Triangle"):
        schedule_from_config({"Triangle": {"base_lr": 1.0}})
    with pytest.raises(WorkerError, match="Cosine.*bogus"):
        schedule_from_config({"Cosine": {"base_lr": 1.0, "total_steps": 5, "bogus": 1}})
    with pytest.raises(WorkerError, match="exactly one"):
        schedule_from_config({"Cosine": {}, "Linear": {}})
