"""Loop detection: repeat, no progress and frequency, each warning then blocking."""

from __future__ import annotations

from capd.sidecar.server._loops import LoopDetector, LoopPolicy


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def detector(**policy: object) -> tuple[LoopDetector, Clock]:
    clock = Clock()
    return LoopDetector(LoopPolicy(**policy), clock=clock), clock  # type: ignore[arg-type]


def test_the_same_call_warns_from_the_third_and_blocks_from_the_fifth() -> None:
    loops, clock = detector()
    decisions = []
    for _ in range(6):
        decisions.append(loops.before("s1", "web.fetch", {"url": "u"}).decision)
        clock.now += 1
    assert decisions == ["allow", "allow", "warn", "warn", "block", "block"]
    verdict = loops.before("s1", "web.fetch", {"url": "u"})
    assert verdict.pattern == "repeat"
    assert "web.fetch was called 7 times with the same parameters" in (verdict.message or "")


def test_other_parameters_other_sessions_and_time_are_not_a_repeat() -> None:
    loops, clock = detector()
    for i in range(10):
        assert loops.before("s1", "web.fetch", {"url": f"u{i}"}).decision == "allow"
    for _ in range(4):
        loops.before("s2", "web.fetch", {"url": "same"})
    assert loops.before("s3", "web.fetch", {"url": "same"}).decision == "allow"
    clock.now += 61  # the window has passed
    assert loops.before("s2", "web.fetch", {"url": "same"}).decision == "allow"


def test_parameter_order_does_not_hide_a_repeat() -> None:
    loops, _ = detector(warn_at=2)
    loops.before("s", "c.x", {"a": 1, "b": 2})
    assert loops.before("s", "c.x", {"b": 2, "a": 1}).decision == "warn"


def test_the_same_answer_again_and_again_warns_then_blocks_the_next_call() -> None:
    loops, clock = detector()
    seen = []
    for page in range(4):
        assert loops.before("s", "docs.list", {"page": page}).decision == "allow"
        seen.append(loops.after("s", "docs.list", {"items": []}).decision)
        clock.now += 1
    assert seen == ["allow", "allow", "warn", "warn"]
    verdict = loops.before("s", "docs.list", {"page": 99})
    assert (verdict.decision, verdict.pattern) == ("block", "no_progress")
    assert "answered the same result 4 times in a row" in (verdict.message or "")


def test_a_different_answer_breaks_the_streak() -> None:
    loops, _ = detector()
    for i in range(6):
        loops.before("s", "q.poll", {"i": i})
        assert loops.after("s", "q.poll", {"n": i % 2}).decision == "allow"


def test_too_many_calls_a_minute_warn_then_block() -> None:
    loops, clock = detector(per_minute_warn=5, per_minute_block=8)
    decisions = []
    for i in range(10):
        decisions.append(loops.before("s", "m.ping", {"i": i}).decision)
        clock.now += 0.5
    assert decisions[:5] == ["allow"] * 5
    assert decisions[5:8] == ["warn"] * 3
    assert decisions[8:] == ["block"] * 2
    clock.now += 61
    assert loops.before("s", "m.ping", {"i": 99}).decision == "allow"


def test_callers_without_a_session_are_not_checked_unless_asked() -> None:
    loops, _ = detector()
    assert all(loops.before(None, "c.x", {}).decision == "allow" for _ in range(10))
    strict, _ = detector(anonymous=True)
    assert [strict.before(None, "c.x", {}).decision for _ in range(5)][-1] == "block"


def test_an_operator_reset_forgets_a_session() -> None:
    loops, _ = detector()
    for _ in range(5):
        loops.before("s", "c.x", {})
    assert loops.before("s", "c.x", {}).decision == "block"
    assert loops.reset("s") is True
    assert loops.before("s", "c.x", {}).decision == "allow"
    assert loops.reset("nobody") is False


def test_sessions_are_bounded() -> None:
    loops, _ = detector(max_sessions=3)
    for i in range(10):
        loops.before(f"s{i}", "c.x", {})
    assert [s["session"] for s in loops.sessions()] == ["s9", "s8", "s7"]


def test_state_is_bounded_whatever_the_rate() -> None:
    """Thousands of calls a second in one session keep at most 1,024 times per distinct
    call and 256 distinct calls; frequency is kept as per-second counts."""
    loops, clock = detector(warn_at=10**8, block_at=10**8 + 1, per_minute_warn=10**8,
                            per_minute_block=10**8 + 1)
    for i in range(20_000):
        loops.before("s", "c.x", {} if i % 2 else {"i": i % 1000})
        clock.now += 0.001
    state = loops._sessions["s"]
    assert len(state.repeats) <= 256
    assert max(len(t) for t in state.repeats.values()) <= 1024
    assert len(state.per_cap["c.x"].buckets) <= 61
    listed = loops.sessions()[0]
    assert listed["calls_last_minute"] == 20_000


def test_sessions_idle_past_every_window_are_forgotten() -> None:
    """A session whose last call left both the window and the minute holds nothing that can
    count again: it is dropped (memory stays bounded by the sessions active in the last
    minute, not by every session ever seen), and one still in its window is kept."""
    loops, clock = detector()
    for n in range(50):
        loops.before(f"old-{n}", "x.y", {"n": n})
    clock.now += 30
    loops.before("recent", "x.y", {})
    clock.now += 31  # the old ones: 61 s idle; recent: 31 s
    loops.before("new", "x.y", {})
    assert {s["session"] for s in loops.sessions()} == {"recent", "new"}
    # what a kept session remembers still counts: its third identical call warns
    loops.before("recent", "x.y", {})
    assert loops.before("recent", "x.y", {}).decision == "warn"


def test_a_short_fingerprint_is_its_own_small_object() -> None:
    """A short key is a copy of orjson's bytes: orjson's own object keeps a 4 KiB buffer,
    and a session keeps up to hundreds of keys."""
    import tracemalloc

    from capd.sidecar.server._loops import fingerprint

    assert fingerprint({"n": 1}) == b'{"n":1}'
    tracemalloc.start()
    try:
        kept = [fingerprint({"n": n}) for n in range(200)]
        held, _peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(kept) == 200
    assert held < 200 * 200  # a few dozen bytes each, not 4 KiB
