"""``Sampler(weight_update=...)``: how a weight push meets the running completions, set in one
place for both backends (the in-process sampler's ``weight_update``; a started vLLM server's
``--ludic-weight-update``, checked in tests/test_demo_vllm.py)."""

from __future__ import annotations

import pytest

from ludic_lab.aio import run_sync
from ludic_lab.sampler import Sampler


def test_the_local_sampler_takes_the_mode(tiny_model_dir: str) -> None:
    async def open_and_read(mode: str) -> str:
        async with Sampler("local", tiny_model_dir, max_batch_size=4, weight_update=mode) as s:
            return s.client.weight_update

    assert run_sync(open_and_read("in_flight")) == "in_flight"
    assert run_sync(open_and_read("drain")) == "drain"


def test_an_unknown_mode_is_refused_before_anything_loads(tiny_model_dir: str) -> None:
    with pytest.raises(ValueError, match="weight_update must be 'drain' or 'in_flight'"):
        Sampler("local", tiny_model_dir, weight_update="pause")
