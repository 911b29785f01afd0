"""OpThreads: plain ops in threads, answered to the loop in batches, with pool semantics."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from capd.registry import OpThreads


async def test_results_and_errors_reach_the_loop() -> None:
    threads = OpThreads(max_workers=4)
    try:
        answer, running = threads.run_soon(lambda: threading.current_thread().name)
        assert (await answer).startswith("capd-op_")
        assert running.done()

        def boom() -> None:
            raise KeyError("missing")

        failed, _ = threads.run_soon(boom)
        with pytest.raises(KeyError, match="missing"):
            await failed
    finally:
        threads.shutdown(cancel_futures=True)


async def test_many_calls_at_once_all_answer_once_each() -> None:
    threads = OpThreads(max_workers=8)
    try:
        answers = await asyncio.gather(*(threads.run_soon(lambda i=i: i * i)[0]
                                         for i in range(5000)))
        assert answers == [i * i for i in range(5000)]
        assert threads.threads <= 8
    finally:
        threads.shutdown(cancel_futures=True)


async def test_a_blocked_call_does_not_hold_the_others() -> None:
    threads = OpThreads(max_workers=4)
    gate = threading.Event()
    try:
        stuck, stuck_running = threads.run_soon(lambda: gate.wait(10))
        quick, _ = threads.run_soon(lambda: "quick")
        assert await asyncio.wait_for(quick, timeout=5) == "quick"
        assert not stuck.done()
        assert not stuck_running.done()
        gate.set()
        assert await asyncio.wait_for(stuck, timeout=5) is True
    finally:
        gate.set()
        threads.shutdown(cancel_futures=True)


async def test_no_more_threads_than_max_workers_and_queued_calls_wait() -> None:
    threads = OpThreads(max_workers=2)
    gate = threading.Event()
    try:
        held = [threads.run_soon(lambda: gate.wait(10))[0] for _ in range(2)]
        queued, queued_running = threads.run_soon(lambda: "after")
        assert threads.threads == 2  # started as the calls came, none for the third
        assert not queued.done()
        assert not queued_running.done()
        gate.set()
        assert await asyncio.wait_for(queued, timeout=5) == "after"
        assert await asyncio.gather(*held) == [True, True]
    finally:
        gate.set()
        threads.shutdown(cancel_futures=True)


async def test_a_call_given_up_on_before_it_started_never_runs() -> None:
    threads = OpThreads(max_workers=1)
    gate = threading.Event()
    ran = []
    try:
        first, _ = threads.run_soon(lambda: gate.wait(10))
        second, second_running = threads.run_soon(lambda: ran.append("second"))
        second.cancel()
        gate.set()
        await first
        deadline = time.monotonic() + 5
        while not second_running.done() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert second_running.done()
        assert ran == []
    finally:
        gate.set()
        threads.shutdown(cancel_futures=True)


async def test_a_timed_out_call_keeps_its_handle_until_the_thread_returns() -> None:
    """The caller's timeout cancels its future; the handle still says the thread runs."""
    threads = OpThreads(max_workers=2)
    gate = threading.Event()
    try:
        answer, running = threads.run_soon(lambda: gate.wait(10))
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(answer, timeout=0.1)
        assert answer.cancelled()
        assert not running.done()
        gate.set()
        deadline = time.monotonic() + 5
        while not running.done() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert running.done()
        # its late answer is dropped (the future is cancelled), and the pool answers on
        next_answer, _ = threads.run_soon(lambda: "next")
        assert await asyncio.wait_for(next_answer, timeout=5) == "next"
    finally:
        gate.set()
        threads.shutdown(cancel_futures=True)


def test_it_is_an_executor_too() -> None:
    threads = OpThreads(max_workers=2)
    try:
        assert threads.submit(pow, 2, 10).result(timeout=5) == 1024
        failing = threads.submit(int, "x")
        with pytest.raises(ValueError, match="invalid literal"):
            failing.result(timeout=5)
    finally:
        threads.shutdown()
    with pytest.raises(RuntimeError, match="after shutdown"):
        threads.submit(pow, 2, 2)


def test_shutdown_drops_what_no_thread_took() -> None:
    threads = OpThreads(max_workers=1)
    gate = threading.Event()
    held = threads.submit(gate.wait, 10)
    waiting = threads.submit(pow, 2, 3)
    deadline = time.monotonic() + 5
    while not held.running() and time.monotonic() < deadline:  # the thread took it
        time.sleep(0.01)
    assert held.running()
    threads.shutdown(cancel_futures=True)
    assert waiting.cancelled()
    gate.set()
    assert held.result(timeout=5) is True


async def test_an_op_raising_stopiteration_strands_nothing_else_in_its_batch() -> None:
    """An asyncio future cannot hold StopIteration: it becomes a RuntimeError, and the
    calls answered in the same batch are answered too."""
    threads = OpThreads(max_workers=3)
    gate = threading.Barrier(3)

    def stop() -> None:
        gate.wait(5)
        raise StopIteration("done early")

    def fine() -> str:
        gate.wait(5)
        return "ok"

    try:
        answers = await asyncio.wait_for(asyncio.gather(
            threads.run_soon(stop)[0], threads.run_soon(fine)[0], threads.run_soon(fine)[0],
            return_exceptions=True), timeout=5)
        assert isinstance(answers[0], RuntimeError)
        assert "StopIteration" in str(answers[0])
        assert answers[1:] == ["ok", "ok"]
    finally:
        threads.shutdown(cancel_futures=True)


async def test_a_call_cancelled_before_any_thread_took_it_is_done_at_once() -> None:
    """Its handle says done without waiting for a thread (nothing of it will run), so a
    write given up on that way is not mistaken for one still running."""
    threads = OpThreads(max_workers=1)
    gate = threading.Event()
    try:
        busy, _ = threads.run_soon(lambda: gate.wait(10))
        waiting, waiting_running = threads.run_soon(lambda: "never")
        assert not waiting_running.done()
        waiting.cancel()
        assert waiting_running.done()
        gate.set()
        await busy
    finally:
        gate.set()
        threads.shutdown(cancel_futures=True)


def test_a_new_loop_takes_over_after_the_old_one_closed_mid_call() -> None:
    """An answer finished after its loop closed does not keep later loops from hearing."""
    threads = OpThreads(max_workers=1)
    gate = threading.Event()

    async def abandon() -> None:
        answer, _ = threads.run_soon(lambda: gate.wait(10))
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(answer, timeout=0.05)

    try:
        asyncio.run(abandon())
        gate.set()  # the op finishes now, its loop gone
        # The one thread takes calls in order: once this one is answered, it has handled
        # the abandoned op's answer (and its wake-up of the closed loop) before it.
        assert threads.submit(lambda: "after").result(timeout=5) == "after"

        async def later() -> int:
            answer, _ = threads.run_soon(lambda: 42)
            return int(await asyncio.wait_for(answer, timeout=5))

        assert asyncio.run(later()) == 42
    finally:
        gate.set()
        threads.shutdown(cancel_futures=True)
