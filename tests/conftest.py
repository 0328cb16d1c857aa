"""Shared test set-up: kernels run through the Triton interpreter on a CPU (kerneltrial.ops sets it),
and every test starts from, and leaves behind, the same global operator registry."""

import json
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import kerneltrial.ops  # noqa: F401  (selects the interpreter before any kernel is defined)
from kerneltrial.ops import launch, registry
from kerneltrial.ops.registry import Impl, Operator

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = pytest.StashKey[list[str]]()
DURATIONS = Path(__file__).with_name("durations.json")  # scripts/test_durations.py writes it from a full run
# A test measured this long or longer is `slow`: the quick subset (-m "not slow and not serving")
# keeps the rest: 1539 tests in 209 s on 2 cores (measured 2026-12-02, README).
QUICK_LIMIT_S = 1.5


@dataclass(frozen=True)
class RegistrySnapshot:
    """The registered operators, in order, each with a copy of its implementations at snapshot time."""

    entries: tuple[tuple[Operator, dict[str, Impl]], ...]


def snapshot_registry() -> RegistrySnapshot:
    # The built-in operators register once (ops/catalog.py, on the first `load_builtin_ops`): load
    # them before the snapshot, or a restore would drop operators first loaded during the test.
    registry.load_builtin_ops()
    return RegistrySnapshot(tuple((op, dict(op.impls)) for op in registry._OPERATORS.values()))


def restore_registry(snapshot: RegistrySnapshot) -> None:
    """Put back exactly the snapshot's operators and implementations (the same objects: modules
    that hold an Operator keep seeing the registered one)."""
    registry._OPERATORS.clear()
    for op, impls in snapshot.entries:
        op.impls.clear()
        op.impls.update(impls)
        registry._OPERATORS[op.name] = op


@pytest.fixture(autouse=True)
def _registry_restored() -> Iterator[None]:
    """A test that registers an operator or an arm (user modules, planted kernels, protocols with
    impl_modules run in-process) must not leak it into the next test."""
    snapshot = snapshot_registry()
    yield
    restore_registry(snapshot)


@pytest.fixture(scope="module", autouse=True)
def _registry_restored_per_module() -> Iterator[None]:
    """Likewise for module-scoped fixtures (a trial run once per module with user arms): what they
    register is gone when the module ends, not left to the tests of the next module."""
    snapshot = snapshot_registry()
    yield
    restore_registry(snapshot)


@pytest.fixture
def device():
    return launch.device()


@pytest.fixture
def report_benchmark(request: pytest.FixtureRequest) -> Callable[[str, float], None]:
    """Report a measured time in seconds, never assert it (machines and their load differ): one of
    the test's user_properties (what `--junitxml` writes) and a line in the terminal summary's
    "benchmarks" section. Not the record_property fixture: it warns under the default xunit2."""

    def report(name: str, seconds: float) -> None:
        request.node.user_properties.append((name, seconds))
        request.config.stash.setdefault(BENCHMARKS, []).append(f"{request.node.nodeid}: {name} {seconds:.3f} s")

    return report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    lines = config.stash.get(BENCHMARKS, [])
    if lines:
        terminalreporter.section("benchmarks (reported, not asserted)")
        for line in lines:
            terminalreporter.write_line(line)


def pytest_configure(config: pytest.Config) -> None:
    """A shell starts background jobs with SIGINT ignored, and children inherit an ignored
    signal through exec: the tests that interrupt a kerneltrial subprocess (exit 130, servers
    stopped) would then test nothing. Caught signals revert to the default in a child, so
    catching SIGINT here gives every subprocess the normal Ctrl-C behaviour."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    one_torch_thread()


def one_torch_thread() -> None:
    """Every test process runs torch on one CPU thread (its subprocesses keep torch's default: no
    variable is set). On CI's 2 cores two xdist workers, and a vLLM server whose OpenMP threads
    spin bound to both cores, leave torch's second thread descheduled at every parallel region:
    tests/ops/test_domain_holes.py's four panel tests took 85-114 s each in CI beside the serving
    tests, under 1 s here; the tiny model's bf16 [8, 64] x [64, 512] linear took 8 ms with 2
    threads and 0.23 ms with 1 on a loaded 2-core machine."""
    import torch

    torch.set_num_threads(1)


# a test that uses one of these fixtures (directly or through another) starts that kind of process,
# and carries its marker whatever its module says: `-m "not serving"` and `-m "not ray"` leave it out
PROCESS_FIXTURES = {"vllm_client": "serving", "vllm_server_cmd": "serving", "cluster": "ray"}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests measured at QUICK_LIMIT_S or longer (DURATIONS), and every test that starts a local Ray
    cluster, are marked `slow`. Tests that start a real vLLM server run on one xdist worker, one
    after another (--dist loadgroup): two servers on CI's two cores would slow both. The Ray tests
    likewise share one worker (one local cluster at a time). tryfirst: xdist's worker reads the
    xdist_group marks in its own pytest_collection_modifyitems, which ran before this one, so the
    groups added here were never seen (every vLLM and Ray test went to either worker)."""
    measured: dict[str, float] = json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}
    for item in items:
        for fixture in sorted(PROCESS_FIXTURES.keys() & set(getattr(item, "fixturenames", ()))):
            item.add_marker(PROCESS_FIXTURES[fixture])
        if measured.get(item.nodeid, 0.0) >= QUICK_LIMIT_S or item.get_closest_marker("ray") is not None:
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("serving") is not None:
            item.add_marker(pytest.mark.xdist_group("vllm"))
        elif item.get_closest_marker("ray") is not None:
            item.add_marker(pytest.mark.xdist_group("ray"))
