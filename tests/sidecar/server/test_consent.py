"""Consent grants: persisted, expiring, per session, refused when damaged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from capd.sidecar.server._consent import ConsentStore, ConsentStoreCorrupt, UnknownGrant


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_a_grant_covers_its_operations_until_it_expires(tmp_path: Path) -> None:
    clock = Clock()
    store = ConsentStore.open(tmp_path, clock=clock)
    assert store.missing(["vault.write", "mail.send"], None) == ["vault.write", "mail.send"]
    grant = store.grant(["vault.write"], ttl_s=3600)
    assert store.missing(["vault.write", "mail.send"], None) == ["mail.send"]
    clock.now += 3601
    assert store.missing(["vault.write"], None) == ["vault.write"]
    assert grant.id not in {g.id for g in store.live()}


def test_grants_survive_a_restart_and_expired_ones_do_not(tmp_path: Path) -> None:
    clock = Clock()
    store = ConsentStore.open(tmp_path, clock=clock)
    keep = store.grant(["vault.*"], ttl_s=7200)
    store.grant(["mail.send"], ttl_s=60)
    clock.now += 120
    again = ConsentStore.open(tmp_path, clock=clock)
    assert [g.id for g in again.live()] == [keep.id]
    assert again.missing(["vault.write", "mail.send"], None) == ["mail.send"]


def test_a_session_grant_covers_only_that_session(tmp_path: Path) -> None:
    store = ConsentStore.open(tmp_path, clock=Clock())
    store.grant(["vault.write"], ttl_s=60, session="agent-1")
    assert store.missing(["vault.write"], "agent-1") == []
    assert store.missing(["vault.write"], "agent-2") == ["vault.write"]
    assert store.missing(["vault.write"], None) == ["vault.write"]


def test_revoke_removes_a_grant_and_an_unknown_id_says_which_exist(tmp_path: Path) -> None:
    store = ConsentStore.open(tmp_path, clock=Clock())
    grant = store.grant(["a.b"], ttl_s=60)
    store.revoke(grant.id)
    assert store.missing(["a.b"], None) == ["a.b"]
    with pytest.raises(UnknownGrant, match="no consent grant 'nope'"):
        store.revoke("nope")
    assert ConsentStore.open(tmp_path).live() == []


def test_bad_grants_are_refused(tmp_path: Path) -> None:
    store = ConsentStore.open(tmp_path, clock=Clock())
    with pytest.raises(ValueError, match="at least one operation"):
        store.grant([" "], ttl_s=60)
    with pytest.raises(ValueError, match="positive"):
        store.grant(["a.b"], ttl_s=0)


@pytest.mark.parametrize("content", [b"", b"{", b"[]", b'{"format": 9, "grants": []}',
                                     b'{"format": 1, "grants": [{"id": "x"}]}'])
def test_a_damaged_file_is_refused_and_left_alone(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "consent.json").write_bytes(content)
    with pytest.raises(ConsentStoreCorrupt, match="move it aside"):
        ConsentStore.open(tmp_path)
    assert (tmp_path / "consent.json").read_bytes() == content


def test_the_file_is_replaced_whole(tmp_path: Path) -> None:
    store = ConsentStore.open(tmp_path, clock=Clock())
    store.grant(["a.b"], ttl_s=60)
    data = json.loads((tmp_path / "consent.json").read_text())
    assert data["format"] == 1
    assert [g["operations"] for g in data["grants"]] == [["a.b"]]
    assert [p.name for p in tmp_path.iterdir()] == ["consent.json"]
