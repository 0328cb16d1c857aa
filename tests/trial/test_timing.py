"""The lead-spin check: a sample during which the host fell behind the GPU is taken again
with a longer lead, and the longer lead is kept."""

from __future__ import annotations

from kerneltrial.trial import timing


def test_next_lead_doubles_only_when_the_host_fell_behind():
    assert timing.next_lead(200_000, 3, host_behind=False) is None
    assert timing.next_lead(200_000, 3, host_behind=True) == 400_000
    at_cap = timing.LEAD_CYCLES_MAX // 4
    assert timing.next_lead(at_cap, 4, host_behind=True) is None  # already the longest spin


def test_a_host_bound_sample_is_retaken_with_a_longer_lead(monkeypatch):
    """Two host-bound attempts (the GPU caught up) are discarded; the third is kept."""
    timer = timing.Timer(name="cuda-events", is_gpu=True, cold=True)
    attempts = []

    def measure(call, calls, hooks=None):
        attempts.append(timer.lead_cycles_per_call)
        behind = len(attempts) < 3
        return (99_000 if behind else 10_000), behind

    monkeypatch.setattr(timer, "_events_cold", measure)
    assert timer.sample(lambda: None, 2) == 10_000
    start = timing.LEAD_CYCLES_PER_CALL
    assert attempts == [start, 2 * start, 4 * start]
    assert timer.retaken == 2 and timer.lead_cycles_per_call == 4 * start
    timer.sample(lambda: None, 2)  # the next sample starts with the longer lead
    assert attempts[-1] == 4 * start and timer.retaken == 2


def test_a_sample_at_the_longest_lead_is_kept(monkeypatch):
    timer = timing.Timer(name="cuda-events", is_gpu=True, cold=False, lead_cycles_per_call=timing.LEAD_CYCLES_MAX)
    monkeypatch.setattr(timer, "_events_hot", lambda call, calls, hooks=None: (5_000, True))
    assert timer.sample(lambda: None, 1) == 5_000
    assert timer.retaken == 0


class FakeEvent:
    """Stands in for torch.cuda.Event: logs record/query; the lead's query answers `behind`."""

    log: list[str] = []
    behind = False

    def __init__(self, enable_timing: bool = False) -> None:
        self.timing = enable_timing

    def record(self) -> None:
        FakeEvent.log.append("record" if self.timing else "lead-recorded")

    def query(self) -> bool:
        FakeEvent.log.append("query")
        return FakeEvent.behind

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: FakeEvent) -> float:
        return 0.001  # ms


def test_the_lead_spins_for_the_timers_lead_and_is_queried_after_the_whole_sample(monkeypatch):
    FakeEvent.log, FakeEvent.behind = [], False
    monkeypatch.setattr(timing.torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(timing.torch.cuda, "_sleep", lambda cycles: FakeEvent.log.append(f"sleep {cycles}"))
    for cold in (True, False):
        FakeEvent.log.clear()
        timer = timing.Timer(name="cuda-events", is_gpu=True, cold=cold, lead_cycles_per_call=1000)
        assert timer.sample(lambda: FakeEvent.log.append("call"), 3) == (3000 if cold else 1000)
        assert FakeEvent.log[:2] == ["sleep 3000", "lead-recorded"]
        assert FakeEvent.log.count("call") == 3 and FakeEvent.log[-1] == "query"  # after every call and record
    FakeEvent.log.clear()
    FakeEvent.behind = True  # always behind: doubled up to the cap, then kept and counted
    timer = timing.Timer(name="cuda-events", is_gpu=True, cold=False, lead_cycles_per_call=timing.LEAD_CYCLES_MAX // 2)
    timer.sample(lambda: None, 1)
    assert timer.retaken == 1 and timer.kept_behind == 1


def test_a_graph_sample_times_one_replay(monkeypatch):
    FakeEvent.log, FakeEvent.behind = [], False
    monkeypatch.setattr(timing.torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(timing.torch.cuda, "_sleep", lambda cycles: FakeEvent.log.append(f"sleep {cycles}"))
    timer = timing.Timer(name="cuda-graph", is_gpu=True, cold=False)
    monkeypatch.setattr(timer, "_graph", lambda call, calls, key: lambda: FakeEvent.log.append(f"replay of {calls}"))
    timer.sample(lambda: None, 5)
    assert FakeEvent.log[0] == f"sleep {timing.LEAD_CYCLES_PER_CALL}" and "replay of 5" in FakeEvent.log


def test_hooks_run_untimed_around_every_call(monkeypatch):
    """before(j) precedes the flush and the start event of call j; after(j) follows its end event;
    with hooks a hot-L2 sample also times each call on its own."""
    FakeEvent.log, FakeEvent.behind = [], False
    monkeypatch.setattr(timing.torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(timing.torch.cuda, "_sleep", lambda cycles: FakeEvent.log.append("sleep"))
    hooks = timing.Hooks(
        before=lambda j: FakeEvent.log.append(f"before {j}"), after=lambda j: FakeEvent.log.append(f"after {j}")
    )
    for cold in (True, False):
        FakeEvent.log.clear()
        timer = timing.Timer(name="cuda-events", is_gpu=True, cold=cold)
        monkeypatch.setattr(timer, "flush", lambda: FakeEvent.log.append("flush"))
        assert timer.sample(lambda: FakeEvent.log.append("call"), 2, hooks=hooks) == 2000  # two pairs of 1 us
        one = ["before {j}", *(["flush"] if cold else []), "record", "call", "record", "after {j}"]
        assert FakeEvent.log == [
            "sleep",
            "lead-recorded",
            *[x.format(j=0) for x in one],
            *[x.format(j=1) for x in one],
            "query",
        ]


def test_host_clock_excludes_the_hooks():
    import time

    timer = timing.Timer(name="host-clock", is_gpu=False, cold=False)
    slow = timing.Hooks(before=lambda j: time.sleep(0.05), after=lambda j: time.sleep(0.05))
    assert timer.sample(lambda: None, 3, hooks=slow) < 20_000_000  # 0.3 s of hooks, not counted
