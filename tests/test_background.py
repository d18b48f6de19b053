"""The background threads of prepare: jobs run in order, the queue is bounded, failures reach the caller."""

from __future__ import annotations

import threading
import time

import pytest

from memtrain.prepare.background import BackgroundJobs

pytestmark = pytest.mark.timeout(30)


def test_jobs_run_in_submission_order_on_another_thread():
    ran, threads = [], set()
    with BackgroundJobs(0) as writer:
        for i in range(200):
            writer.submit(lambda i=i: (ran.append(i), threads.add(threading.get_ident())), 10)
        writer.drain()
    assert ran == list(range(200))
    assert threads and threading.get_ident() not in threads


def test_a_full_queue_makes_the_caller_wait():
    release = threading.Event()
    with BackgroundJobs(100) as writer:
        writer.submit(release.wait, 80)   # running
        writer.submit(lambda: None, 80)   # queued: the queue holds one job whatever its size
        started = time.monotonic()
        threading.Timer(0.3, release.set).start()
        writer.submit(lambda: None, 80)   # must wait until the running job ends
        assert time.monotonic() - started >= 0.25
        writer.drain()


def test_the_first_failure_is_raised_at_the_next_submit_and_later_jobs_never_run():
    ran = []
    with BackgroundJobs(0) as writer:
        writer.submit(lambda: (_ for _ in ()).throw(OSError(28, "disk full")))
        with pytest.raises(OSError, match="disk full"):
            for i in range(100):
                writer.submit(lambda i=i: ran.append(i))
                time.sleep(0.01)
        with pytest.raises(OSError, match="disk full"):
            writer.drain()
    assert len(ran) <= 1  # at most the job submitted while the failing one ran


def test_leaving_on_an_error_cancels_the_queued_jobs():
    ran, release = [], threading.Event()
    with pytest.raises(KeyboardInterrupt), BackgroundJobs(0) as writer:
        writer.submit(release.wait)
        writer.submit(lambda: ran.append("queued"))
        release.set()
        raise KeyboardInterrupt
    assert ran in ([], ["queued"])  # the running job finishes; the queued one may already have started
    assert not any(t.name == "memtrain-background" and t.is_alive() for t in threading.enumerate())
