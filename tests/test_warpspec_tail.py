"""warpspec's tail split on the host (no GPU): `tail_plan` cuts only a last, partial wave's tiles,
gives each idle program at most one slice, leaves no slice empty or shorter than TAIL_MIN_STEPS
(but the last), and the slices it implies cover every K step of every tail tile exactly once; the
config refuses the split where it has no ping-pong consumers."""

from __future__ import annotations

import dataclasses

import pytest

from gluon_survey.kernels import warpspec


def slices(k_steps: int, split: int) -> list[range]:
    """The K steps of each slice of a tail tile, as the kernel's `work_item` cuts them."""
    per = -(-k_steps // split)
    return [range(s * per, min((s + 1) * per, k_steps)) for s in range(split)]


@pytest.mark.parametrize("sm_count", [7, 16, 132])
@pytest.mark.parametrize("tiles", [1, 5, 16, 131, 132, 133, 200, 264, 265, 1728, 2560])
@pytest.mark.parametrize("k_steps", [1, 3, 4, 9, 23, 32, 224])
def test_the_tail_plan_splits_only_the_last_wave_and_covers_k(tiles, sm_count, k_steps):
    tail_from, split = warpspec.tail_plan(tiles, sm_count, k_steps)
    waves, tail = divmod(tiles, sm_count)
    if split == 1:
        assert tail_from == tiles  # every item a whole tile
        assert tail == 0 or sm_count // tail < 2 or k_steps // warpspec.TAIL_MIN_STEPS < 2
        return
    assert tail_from == waves * sm_count and tail > 0
    assert (tiles - tail_from) * split <= sm_count  # one slice a program, at most
    assert split <= sm_count // tail
    parts = slices(k_steps, split)
    assert all(len(p) > 0 for p in parts)
    assert all(len(p) >= warpspec.TAIL_MIN_STEPS for p in parts[:-1])
    assert [k for p in parts for k in p] == list(range(k_steps))


def test_a_tail_split_takes_all_the_idle_sms_it_can():
    """The fp8 miss at 5000 x 8192 x 28672 on 132 SMs: 128-row tiles are 40 x 64 = 2560, 19 waves
    and 52 tiles; 192-row tiles 27 x 64 = 1728, 13 waves and 12 tiles."""
    assert warpspec.tail_plan(2560, 132, 224) == (19 * 132, 2)
    assert warpspec.tail_plan(1728, 132, 224) == (13 * 132, 11)
    assert warpspec.tail_plan(1728, 132, 8) == (13 * 132, 2)  # K = 1024 in fp8: slices of 4 steps
    assert warpspec.tail_plan(1716, 132, 224) == (1716, 1)  # 13 whole waves: nothing to split


def test_only_ping_pong_takes_a_tail_split():
    with pytest.raises(ValueError, match="ping-pong"):
        dataclasses.replace(warpspec.COOPERATIVE, TAIL=True)
    assert dataclasses.replace(warpspec.PINGPONG, TAIL=True).TAIL
