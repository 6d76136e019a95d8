"""Who ``querator serve`` wakes when items become ready (``querator.localserver.waiting``).

The registry runs on an event loop; these tests drive one directly, without sockets. The probe's
timer is the loop's: tests that need it use a short interval and wait for a number of probes, not
for an amount of time.
"""

from __future__ import annotations

import asyncio

from querator.localserver.waiting import Waiter, Waiters


def _woken(waiters: list[Waiter]) -> list[int]:
    return [n for n, waiter in enumerate(waiters) if waiter.event.is_set()]


def test_a_notify_wakes_one_waiter_per_item_oldest_first() -> None:
    async def scenario() -> None:
        registry = Waiters(asyncio.get_running_loop(), probe_interval=3600)
        waiters = [Waiter("jobs") for _ in range(5)]
        for waiter in waiters:
            registry.add(waiter)
        registry.add(Waiter("other"))
        registry.notify("jobs", 2)
        assert _woken(waiters) == [0, 1]
        registry.notify("jobs", 1)  # the woken are not woken twice: the next one is
        assert _woken(waiters) == [0, 1, 2]
        registry.notify("nobody waits here", 3)
        assert _woken(waiters) == [0, 1, 2]

    asyncio.run(scenario())


def test_an_attempt_sends_its_waiter_to_the_back_and_a_full_one_passes_a_wake_on() -> None:
    async def scenario() -> None:
        registry = Waiters(asyncio.get_running_loop(), probe_interval=3600)
        first, second, third = (Waiter("jobs") for _ in range(3))
        for waiter in (first, second, third):
            registry.add(waiter)
        registry.notify("jobs", 1)
        registry.attempting(first)
        assert not first.event.is_set() and first.busy
        # Busy waiters are woken only when no idle one is left.
        registry.notify("jobs", 1)
        assert second.event.is_set() and not first.event.is_set()
        # A full attempt passes a wake on only when no other waiter is woken already: here the
        # second one is, and will look.
        registry.attempted(first, full=True)
        assert not third.event.is_set()
        registry.attempting(second)
        registry.attempted(second, full=True)  # nobody else woken: the next idle one looks too
        assert third.event.is_set()
        registry.attempting(third)
        registry.attempted(third, full=False)  # found less: the queue is drained, nobody is woken
        assert _woken([first, second, third]) == []
        # A waiter woken while busy looks again when its attempt ends.
        registry.attempting(first)
        registry.notify("jobs", 3)
        assert _woken([first, second, third]) == [0, 1, 2]
        registry.attempted(first, full=True)
        assert first.event.is_set()

    asyncio.run(scenario())


def test_a_removed_waiter_is_not_woken_and_an_empty_queue_is_forgotten() -> None:
    async def scenario() -> None:
        registry = Waiters(asyncio.get_running_loop(), probe_interval=3600)
        gone, staying = Waiter("jobs"), Waiter("jobs")
        registry.add(gone)
        registry.add(staying)
        registry.remove(gone)
        registry.remove(gone)  # twice is harmless
        registry.notify("jobs", 1)
        assert not gone.event.is_set() and staying.event.is_set()
        registry.remove(staying)
        assert len(registry) == 0
        assert registry._queues == {}  # its probe is cancelled with it

    asyncio.run(scenario())


def test_the_probe_wakes_one_waiter_per_interval_only_when_nobody_looked() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        registry = Waiters(loop, probe_interval=0.01)
        waiters = [Waiter("jobs") for _ in range(50)]
        for waiter in waiters:
            registry.add(waiter)
        looks = 0
        probes = 0
        real_probe = registry._probe

        def probe(queue_name: str) -> None:
            nonlocal probes
            probes += 1
            real_probe(queue_name)

        registry._probe = probe  # type: ignore[method-assign]

        async def consumer(waiter: Waiter) -> None:
            nonlocal looks
            while True:
                await waiter.event.wait()
                registry.attempting(waiter)
                looks += 1
                await asyncio.sleep(0)
                registry.attempted(waiter, full=False)

        tasks = [asyncio.create_task(consumer(waiter)) for waiter in waiters]
        deadline = loop.time() + 10
        while probes < 20 and loop.time() < deadline:
            await asyncio.sleep(0.005)
        for task in tasks:
            task.cancel()
        # One look per probe at most, whatever the number of waiters (50 here).
        assert probes >= 20
        assert 1 <= looks <= probes + 1, (looks, probes)

    asyncio.run(scenario())


def test_wake_all_wakes_every_queue() -> None:
    async def scenario() -> None:
        registry = Waiters(asyncio.get_running_loop(), probe_interval=3600)
        waiters = [Waiter(name) for name in ("a", "a", "b")]
        for waiter in waiters:
            registry.add(waiter)
        registry.wake_all()
        assert _woken(waiters) == [0, 1, 2]

    asyncio.run(scenario())


def test_the_probes_own_attempt_does_not_skip_the_next_probe() -> None:
    async def scenario() -> None:
        registry = Waiters(asyncio.get_running_loop(), probe_interval=3600)  # probes run by hand
        waiter = Waiter("jobs")
        registry.add(waiter)

        def look() -> None:
            registry.attempting(waiter)
            registry.attempted(waiter, full=False)

        registry._probe("jobs")
        assert waiter.event.is_set()
        look()  # the attempt the probe asked for
        registry._probe("jobs")
        # Every probe interval a look, not every other one (docs/api.md: within half a second).
        assert waiter.event.is_set()
        look()

        registry.notify("jobs", 1)  # a write woke it: that look excuses the next probe
        look()
        registry._probe("jobs")
        assert not waiter.event.is_set()
        registry._probe("jobs")
        assert waiter.event.is_set()

    asyncio.run(scenario())
