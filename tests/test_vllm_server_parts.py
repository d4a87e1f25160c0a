"""The bundled vLLM server's parts that need no server: the check of an update against the
served model's parameters, the safetensors writer of the shared-memory transport, the
admission gate, the bind rule and a busy port. The server itself: tests/test_vllm_server.py.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time

import pytest
import torch

from ludic_lab.inference.vllm.weight_transfer import (
    ModelParamSpec,
    ParamMeta,
    ShmSender,
    UpdateRejected,
    read_safetensors_header,
    write_safetensors,
)

QWEN2_PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}


@pytest.fixture(scope="module")
def tiny_spec(tiny_model_dir):
    return ModelParamSpec.from_checkpoint(tiny_model_dir, dtype="float32", packed_modules=QWEN2_PACKED)


def _metas(tiny_model_dir):
    hdr = read_safetensors_header(os.path.join(tiny_model_dir, "model.safetensors"))
    return [ParamMeta(name, dt, shape) for name, (dt, shape) in hdr.items()]


def test_spec_accepts_the_checkpoint_and_whole_layers(tiny_spec, tiny_model_dir):
    full = _metas(tiny_model_dir)
    assert len(full) == 26 and tiny_spec.aliases == {"lm_head.weight": "model.embed_tokens.weight"}
    tiny_spec.check(full)
    tiny_spec.check([*full, ParamMeta("lm_head.weight", "float32", (2048, 128))])  # a tied state dict
    assert tiny_spec.covers_all(full)
    # a partial update is fine when it covers whole vLLM layers (gate+up form one fused layer)
    mlp = [m for m in full if m.name.startswith("model.layers.1.mlp.")]
    tiny_spec.check(mlp)
    assert not tiny_spec.covers_all(mlp)
    assert tiny_spec.group_of("model.layers.0.self_attn.k_proj.bias") == "model.layers.0.self_attn.qkv_proj"
    # the tied alias: skipped next to the embedding, loaded as the embedding alone
    with_alias = [*full, ParamMeta("lm_head.weight", "float32", (2048, 128))]
    order, rename = tiny_spec.load_plan(with_alias)
    assert "lm_head.weight" not in order and rename == {}
    order, rename = tiny_spec.load_plan([ParamMeta("lm_head.weight", "float32", (2048, 128))])
    assert order == ["lm_head.weight"] and rename == {"lm_head.weight": "model.embed_tokens.weight"}
    assert ModelParamSpec.from_json(tiny_spec.to_json()) == tiny_spec


def test_spec_refusals_name_the_offending_params(tiny_spec, tiny_model_dir):
    full = _metas(tiny_model_dir)

    def refused(metas):
        with pytest.raises(UpdateRejected) as e:
            tiny_spec.check(metas)
        return str(e.value)

    bad_name = [
        m
        if m.name != "model.layers.0.mlp.up_proj.weight"
        else ParamMeta("model.layers.0.mlp.upproj.weight", m.dtype, m.shape)
        for m in full
    ]
    msg = refused(bad_name)
    assert "model.layers.0.mlp.upproj.weight" in msg and "did you mean 'model.layers.0.mlp.up_proj.weight'" in msg
    bad_shape = [m if m.name != "model.norm.weight" else ParamMeta(m.name, m.dtype, (127,)) for m in full]
    msg = refused(bad_shape)
    assert "model.norm.weight [127] (expected [128])" in msg
    bad_dtype = [
        m if m.name != "model.layers.1.self_attn.o_proj.weight" else ParamMeta(m.name, "bfloat16", m.shape)
        for m in full
    ]
    msg = refused(bad_dtype)
    assert "model.layers.1.self_attn.o_proj.weight bfloat16" in msg and "cast the tensors to float32" in msg
    msg = refused([m for m in full if m.name == "model.layers.0.self_attn.q_proj.weight"])
    assert "model.layers.0.self_attn.qkv_proj" in msg and "model.layers.0.self_attn.k_proj.weight" in msg
    assert "repeated names: 'model.norm.weight'" in refused([*full, ParamMeta("model.norm.weight", "float32", (128,))])
    assert "lists no params" in refused([])
    assert "nothing was loaded" in msg


def test_shm_writer_roundtrip_and_sender(tmp_path):
    from safetensors.torch import load_file

    emb = torch.randn(6, 4)
    params = {
        "a.weight": torch.randn(3, 5),
        "b.weight": torch.randn(5, 3).t(),  # not contiguous
        "c.bias": torch.randn(7).to(torch.bfloat16),
        "d.count": torch.tensor([1, 2, 3], dtype=torch.int64),
        "e.scalar": torch.tensor(2.5),
        "f.empty": torch.zeros(0, 4),
        "emb.weight": emb,
        "lm_head.weight": emb,  # shares storage, as tied weights do in a state dict
    }
    path = str(tmp_path / "w.safetensors")
    metas = write_safetensors(path, params)
    assert [m.name for m in metas] == list(params)
    back = load_file(path)
    for k, v in params.items():
        assert back[k].dtype == v.dtype and torch.equal(back[k], v), k
    hdr = read_safetensors_header(path)
    assert list(hdr) == list(params) and hdr["c.bias"] == ("bfloat16", (7,)) and hdr["e.scalar"] == ("float32", ())
    assert [p.name for p in tmp_path.iterdir()] == ["w.safetensors"]  # no temp file left

    sender = ShmSender(str(tmp_path))
    body = sender.stage({"x": torch.ones(2, 2)}, version=7)
    assert body["transport"] == "shm" and body["version"] == 7
    assert body["params"] == [{"name": "x", "dtype": "float32", "shape": [2, 2]}]
    assert os.path.isfile(body["location"]) and body["location"].startswith(str(tmp_path))
    sender.discard(body)
    assert not os.path.exists(body["location"])
    with pytest.raises(ValueError, match="no parameters"):
        sender.stage({})


def test_reused_staging_buffer(tmp_path):
    """ShmSender(reuse=True): one file per parameter layout, overwritten in place (cast on the
    way), never rewritten after an abandoned request, deleted on close; the server-side map
    gives zero-copy views (and stacked q/k/v-style blocks) of it."""
    from safetensors.torch import load_file

    from ludic_lab.inference.vllm.weight_transfer.shm import SafetensorsMap

    s = ShmSender(str(tmp_path), reuse=True)
    a = {
        "q.weight": torch.randn(4, 3),
        "k.weight": torch.randn(2, 3),
        "flag": torch.tensor([True, False, True]),
        "n.weight": torch.randn(5),
    }
    body = s.stage(a, version=3, dtype="bfloat16")
    path = body["location"]
    assert body["keep"] is True and body["version"] == 3
    assert [p["dtype"] for p in body["params"]] == ["bfloat16", "bfloat16", "bool", "bfloat16"]
    with pytest.raises(RuntimeError, match="neither released"):
        s.stage(a)
    s.release(body)
    back = load_file(path)  # plain safetensors; the bool leaves n.weight misaligned for a view
    assert torch.equal(back["q.weight"], a["q.weight"].bfloat16()) and torch.equal(back["flag"], a["flag"])
    assert torch.equal(back["n.weight"], a["n.weight"].bfloat16())

    m = SafetensorsMap(path)
    q = m.tensor("q.weight")
    assert m.contains(q.data_ptr()) and torch.equal(q, a["q.weight"].bfloat16())
    qk = m.concat_rows(["q.weight", "k.weight"])  # back to back in the file: a view
    assert m.contains(qk.data_ptr()) and torch.equal(qk, torch.cat([a["q.weight"], a["k.weight"]]).bfloat16())
    kq = m.concat_rows(["k.weight", "q.weight"])  # not in file order: a copy
    assert not m.contains(kq.data_ptr()) and torch.equal(kq, torch.cat([a["k.weight"], a["q.weight"]]).bfloat16())
    assert torch.equal(m.tensor("n.weight"), a["n.weight"].bfloat16())

    b = {k: (v + 1 if v.is_floating_point() else ~v) for k, v in a.items()}
    body = s.stage(b, dtype="bfloat16")  # same layout: same file, new bytes (seen through the map)
    assert body["location"] == path and m.still_valid()
    assert torch.equal(m.tensor("q.weight"), b["q.weight"].bfloat16()) and torch.equal(m.tensor("flag"), b["flag"])
    s.discard(body)  # never delivered: the buffer stays for reuse
    assert os.path.exists(path)
    body = s.stage(a, dtype="bfloat16")
    s.abandon(body)  # no answer: the server may still read it, so it is never written again
    body2 = s.stage(a, dtype="bfloat16")
    assert body2["location"] != path and os.path.exists(path)
    s.release(body2)  # a later update completed: the abandoned file goes
    assert not os.path.exists(path) and not m.still_valid()
    m.close()
    body3 = s.stage({"x": torch.ones(2)})  # another layout: a new file replaces the old
    s.release(body3)
    assert not os.path.exists(body2["location"]) and os.path.exists(body3["location"])
    s.close()
    assert list(tmp_path.iterdir()) == []


def test_a_full_shm_folder_is_a_clear_error_and_leaves_no_file(tmp_path, monkeypatch):
    import errno

    def full(fd, offset, size):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)  # (filling the real /dev/shm would fill RAM)
    s = ShmSender(str(tmp_path), reuse=True)
    with pytest.raises(OSError, match="no room for a .* weight staging buffer .*--shm-size"):
        s.stage({"x": torch.ones(1000)})
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    body = s.stage({"x": torch.ones(1000)})  # and the sender still works once there is room
    s.release(body)
    s.close()


def test_stale_update_files_of_dead_processes_are_reaped(tmp_path):
    import subprocess
    import sys

    from ludic_lab.inference.vllm.weight_transfer.shm import reap_stale_files

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    stale = tmp_path / f"ludic_weights_{int(dead.stdout)}_abc.safetensors"
    mine = tmp_path / f"ludic_weights_{os.getpid()}_def.safetensors"
    other = tmp_path / "unrelated.safetensors"
    for f in (stale, mine, other):
        f.write_bytes(b"x")
    assert reap_stale_files(str(tmp_path)) == [str(stale)]
    assert not stale.exists() and mine.exists() and other.exists()
    ShmSender(str(tmp_path), reuse=True)  # a new reusing sender reaps too
    assert mine.exists()


async def test_version_gate_drains_in_flight_and_blocks_admission():
    from ludic_lab.inference.vllm.server.main import DrainTimeout, VersionGate

    gate = VersionGate(5)
    assert await gate.admit() == 5  # one request in flight
    drain = asyncio.ensure_future(gate.close_and_drain(10))
    await asyncio.sleep(0.05)
    assert not drain.done()  # waits for the request
    assert gate.inflight == 1 and gate.update_pending
    late = asyncio.ensure_future(gate.admit())
    await asyncio.sleep(0.05)
    assert not late.done()  # admission is closed while the update is pending
    gate.release()
    await asyncio.wait_for(drain, 1)
    assert gate.inflight == 0 and gate.update_pending  # drained; the update holds admission until it reopens
    gate.version = 6  # the update
    gate.reopen()
    assert await asyncio.wait_for(late, 1) == 6  # the late request sees the new version
    assert gate.inflight == 1 and not gate.update_pending
    # in-flight requests that never finish: the update gives up and admission reopens
    with pytest.raises(DrainTimeout, match="1 generation request"):
        await gate.close_and_drain(0.05)
    assert await asyncio.wait_for(gate.admit(), 1) == 6


def test_bind_rule():
    from ludic_lab.inference.vllm.server.main import check_bind_security, is_loopback

    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1") and is_loopback("127.0.0.2")
    assert not is_loopback("0.0.0.0") and not is_loopback("") and not is_loopback(None) and not is_loopback("10.0.0.1")
    check_bind_security("127.0.0.1", None)
    check_bind_security("0.0.0.0", "tok")
    with pytest.raises(ValueError, match="--ludic-control-token"):
        check_bind_security("0.0.0.0", None)


def test_busy_port_is_a_clear_error_at_once(tiny_model_dir):
    from ludic_lab.inference.launch.server import PortInUseError, start_vllm_server

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        t0 = time.monotonic()
        with pytest.raises(PortInUseError, match=f"port {port} on 127.0.0.1 is already in use"):
            start_vllm_server(tiny_model_dir, port=port)
        assert time.monotonic() - t0 < 5
