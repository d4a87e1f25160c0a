"""``ludic_lab.net.free_port``: the OS's pick by default; under ``$LUDIC_LAB_PORT_RANGE`` (what
each parallel test worker gets, tests/conftest.py) a port of that range, never one this process
handed out a moment ago, skipping ports something holds."""

from __future__ import annotations

import socket

import pytest

from ludic_lab import net


def _range_with_listener() -> tuple[socket.socket, int, int]:
    """A listening socket on a port below the ephemeral range, and a 4-port range starting there
    whose other three ports are free; under parallel workers, inside this worker's own range,
    where no other worker picks a port while this test runs."""
    first, last = net.port_range() or (21000, 31000)
    for low in range(first, last - 3, 97):
        if not all(net.port_is_free("127.0.0.1", p) for p in range(low + 1, low + 4)):
            continue
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", low))
        except OSError:
            s.close()
            continue
        s.listen()
        return s, low, low + 3
    pytest.fail(f"no 4 free ports in a row between {first} and {last}")


def test_free_ports_come_from_the_range_each_once_and_never_a_held_one(monkeypatch: pytest.MonkeyPatch) -> None:
    listener, low, high = _range_with_listener()
    with listener:
        monkeypatch.setenv(net.PORT_RANGE_ENV, f"{low}-{high}")
        monkeypatch.setattr(net, "_handed_out", {})
        picked = [net.free_port() for _ in range(3)]
        assert sorted(picked) == [low + 1, low + 2, low + 3]  # the listener's port is skipped
        assert all(net.port_is_free("127.0.0.1", p) for p in picked)  # picked, not bound
        with pytest.raises(OSError, match=f"no free port on 127.0.0.1 in LUDIC_LAB_PORT_RANGE={low}-{high}"):
            net.free_port()  # the other three were handed out: not again while their servers start


def test_without_a_range_the_os_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(net.PORT_RANGE_ENV, raising=False)
    assert net.port_range() is None
    port = net.free_port()
    assert 0 < port < 65536 and net.port_is_free("127.0.0.1", port)


@pytest.mark.parametrize("spec", ["20000", "a-b", "30000-20000", "0-10", "20000-70000"])
def test_a_malformed_range_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, spec: str) -> None:
    monkeypatch.setenv(net.PORT_RANGE_ENV, spec)
    with pytest.raises(ValueError, match="LUDIC_LAB_PORT_RANGE"):
        net.free_port()
