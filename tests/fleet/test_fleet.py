"""Fleet runs on a local Ray cluster of 2 CPUs (`run --ray`): replicas and shards combine into
the figures their units' runs give (also when a shard's piece is run by hand with `run`), shards
with the protocol's gate over the whole panel; a worker killed mid-unit (the test-only fault
hook) is recorded and `--resume` completes the run with no row lost or repeated; a partial unit
run started on another chip or host is set aside, listed, and the unit starts afresh; verify
catches a tampered unit, tampered combined figures, a shard set that misses or repeats a case,
a unit whose device is not its run's, replicas sharing a GPU, a piece naming another file and
an unlisted set-aside run; more replicas than GPUs are refused; a worker on another device
model refuses its unit; without Ray, `--ray` says how to install it."""

from __future__ import annotations

import csv
import json
import shutil
import statistics
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from kerneltrial.cli.analysis import verify_one
from kerneltrial.cli.fleet import passed
from kerneltrial.fleet.driver import _faults
from kerneltrial.fleet.pieces import path_digests, piece_text
from kerneltrial.fleet.record import Unit, read_fleet
from kerneltrial.fleet.worker import FAULT_ENV, TESTING_ENV, run_unit
from kerneltrial.rundir.hashing import sha256_file
from kerneltrial.rundir.layout import kind_of
from tests.kt import run_cli, write_protocol

ray = pytest.importorskip("ray")
PROTOCOL = """\
name = "fleet-test"
op = "rmsnorm"
candidates = ["kerneltrial"]
seeds = [0]
rounds = 2
warmup = 1
calls_per_sample = 1
l2 = "hot"
bootstrap_resamples = 100
host_samples = 1
host_calls = 1
order_seed = 5

[[cases]]
shape = [2, 64]

[[cases]]
shape = [4, 32]
"""


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def protocol(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_protocol(tmp_path_factory.mktemp("protocol") / "fleet.toml", PROTOCOL)


def fleet_run(protocol: Path, out: Path, *mode: str) -> Path:
    result = run_cli("run", str(protocol), "--out", str(out), "--ray", *mode)
    fleet = read_fleet(out)
    assert fleet.complete and result.exit_code == (
        0 if any(passed(fleet.mode, a) for a in fleet.combined.arms) else 1
    ), result.output
    return out


@pytest.fixture(scope="module")
def replicas(cluster, protocol, tmp_path_factory) -> Path:
    return fleet_run(protocol, tmp_path_factory.mktemp("replicas") / "fleet", "--replicas", "2")


@pytest.fixture(scope="module")
def shards(cluster, protocol, tmp_path_factory) -> Path:
    return fleet_run(protocol, tmp_path_factory.mktemp("shards") / "fleet", "--shard", "cases")


@pytest.fixture
def shard_copy(shards: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "fleet"
    shutil.copytree(shards, copy)
    return copy


def summary(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "summary.json").read_text())


def failed(root: Path) -> dict[str, str]:
    return {c.name: c.detail for c in verify_one(root).failures}


def expected_figures(root: Path) -> dict[str, Any]:
    """The combined figures computed here, by hand, from the units' own summary.json files."""
    fleet = read_fleet(root)
    cases: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for unit in fleet.units:
        for entry in summary(root / unit.run)["cases"]:
            cases.setdefault(entry["case"], []).append((unit.id, entry["arms"]["kerneltrial"]))
    rows = {
        case: {
            "workers": [w for w, _ in ran],
            "speedups": [f["speedup"] for _, f in ran],
            "verdicts": [f["verdict"] for _, f in ran],
            "pooled": statistics.geometric_mean([f["speedup"] for _, f in ran]),
            "range": max(f["speedup"] for _, f in ran) - min(f["speedup"] for _, f in ran) if len(ran) > 1 else None,
            "sd": statistics.stdev([f["speedup"] for _, f in ran]) if len(ran) > 1 else None,
        }
        for case, ran in cases.items()
    }
    every = [s for row in rows.values() for s in row["speedups"]]
    gates = ["kerneltrial" in summary(root / u.run)["gate"]["passed_arms"] for u in fleet.units]
    entries = [entry for ran in cases.values() for entry in ran]
    return {"rows": rows, "pooled_geomean": statistics.geometric_mean(every), "gates": gates, "entries": entries}


def assert_combined_as_by_hand(root: Path) -> None:
    combined = read_fleet(root).combined
    want = expected_figures(root)
    assert [c.case for c in combined.cases] == list(want["rows"])  # the protocol's case order
    for c in combined.cases:
        row = want["rows"][c.case]
        assert (c.workers, c.speedups, c.verdicts) == (row["workers"], row["speedups"], row["verdicts"])
        assert c.pooled_speedup == pytest.approx(row["pooled"], rel=1e-12)
        assert c.between_worker_range == (None if row["range"] is None else pytest.approx(row["range"]))
        assert c.between_worker_sd == (None if row["sd"] is None else pytest.approx(row["sd"]))
    [arm] = combined.arms
    assert arm.pooled_geomean == pytest.approx(want["pooled_geomean"], rel=1e-12)
    assert arm.gate_passed == want["gates"] and arm.passed_in_every_unit == all(want["gates"])
    if read_fleet(root).mode == "replicas":
        assert arm.panel_gate is None
        return
    # the protocol's gate (no_loss) over the whole panel: every case once, from its shard
    statuses = [f["status"] for _, f in want["entries"]]
    verdicts = [f["verdict"] for _, f in want["entries"]]
    assert arm.panel_gate.passed == (set(statuses) == {"timed"} and "loss" not in verdicts)
    assert arm.panel_gate.geomean == pytest.approx(want["pooled_geomean"], rel=1e-12)
    assert (arm.panel_gate.reasons == []) == arm.panel_gate.passed


@pytest.mark.slow
def test_replicas_run_the_whole_protocol_per_unit_and_combine_as_by_hand(replicas, protocol):
    fleet = read_fleet(replicas)
    assert kind_of(replicas) == "fleet" and fleet.mode == "replicas"
    assert [(u.id, u.case_indices, u.order_seed, u.attempts) for u in fleet.units] == [
        ("replica-1", [0, 1], 6, 1),
        ("replica-2", [0, 1], 7, 1),
    ]
    for unit in fleet.units:
        plan = json.loads((replicas / unit.run / "plan.json").read_text())
        assert plan["order_seed"] == unit.order_seed and len(plan["cases"]) == 2
        assert unit.device and unit.host  # from the unit's own provenance.json
    assert_combined_as_by_hand(replicas)
    assert all(c.between_worker_sd is not None for c in fleet.combined.cases)  # two units per case
    assert verify_one(replicas).ok, failed(replicas)
    result = run_cli("report", str(replicas))
    report = (replicas / "report.md").read_text()
    assert result.exit_code == 0 and "holds on every GPU" in report and "between range" in report
    assert "panel" not in report and "every shard" not in report
    assert (replicas / "workers" / "replica-1" / "report.md").is_file()


@pytest.mark.slow
def test_shards_deal_each_case_to_one_unit_and_pieces_run_by_hand_combine_the_same(cluster, shard_copy, protocol):
    fleet = read_fleet(shard_copy)
    assert [(u.id, u.case_indices, u.order_seed) for u in fleet.units] == [("shard-1", [0], 5), ("shard-2", [1], 5)]
    assert_combined_as_by_hand(shard_copy)
    assert verify_one(shard_copy).ok, failed(shard_copy)
    result = run_cli("report", str(shard_copy))
    report = (shard_copy / "report.md").read_text()
    assert result.exit_code == 0 and "gate over the whole panel" in report and "passed in every shard" in report, report
    assert "holds on every GPU" not in report
    # run shard-1's piece by hand with the ordinary `run`, put it in the worker's place, recombine
    by_hand = shard_copy.parent / "by-hand"
    result = run_cli("run", str(shard_copy / "pieces" / "shard-1.toml"), "--out", str(by_hand))
    assert result.exit_code in (0, 1), result.output
    ray_plan = json.loads((shard_copy / "workers" / "shard-1" / "plan.json").read_text())
    hand_plan = json.loads((by_hand / "plan.json").read_text())
    assert hand_plan.pop("inputs_seed") != ray_plan.pop("inputs_seed")  # each run draws its own inputs
    assert hand_plan == ray_plan  # otherwise the worker ran exactly the piece
    shutil.rmtree(shard_copy / "workers" / "shard-1")
    shutil.copytree(by_hand, shard_copy / "workers" / "shard-1")
    assert "combined figures" in failed(shard_copy)  # the record still holds the Ray unit's figures
    result = run_cli("run", str(protocol), "--out", str(shard_copy), "--ray", "--shard", "cases", "--resume")
    assert result.exit_code in (0, 1), result.output
    assert [u.attempts for u in read_fleet(shard_copy).units] == [1, 1]  # nothing ran again
    assert_combined_as_by_hand(shard_copy)
    assert set(failed(shard_copy)) == {"report.md"}  # rendered before the record was combined again: stale
    result = run_cli("report", str(shard_copy))  # a stale page does not stop its own rendering
    assert result.exit_code == 0, result.output
    assert verify_one(shard_copy).ok, failed(shard_copy)


def timing_keys(run_dir: Path) -> list[tuple[str, ...]]:
    with (run_dir / "timings.csv").open(newline="") as handle:
        return [(r["case"], r["seed"], r["round"], r["arm"]) for r in csv.DictReader(handle)]


@pytest.mark.slow
def test_a_worker_killed_mid_unit_is_recorded_and_resume_completes_it(cluster, protocol, tmp_path, monkeypatch):
    out = tmp_path / "fleet"
    monkeypatch.setenv(FAULT_ENV, "replica-2:2")  # replica-2's worker dies once 2 timing rows are written
    monkeypatch.setenv(TESTING_ENV, "1")  # the fault hook is inert without it
    result = run_cli("run", str(protocol), "--out", str(out), "--ray", "--replicas", "2")
    assert result.exit_code == 1 and f"--out {out} --ray --replicas 2 --resume" in result.output, result.output
    fleet = read_fleet(out)
    first, second = fleet.units
    assert first.status == "finished" and second.status == "failed" and fleet.finished_at is None
    assert "Error" in second.error, second.error  # Ray's error for the dead worker
    assert len(timing_keys(out / second.run)) >= 2 and not (out / second.run / "summary.json").exists()
    assert "replica-2 did not finish" in failed(out)["fleet units"]
    kept = timing_keys(out / second.run)
    monkeypatch.delenv(FAULT_ENV)
    result = run_cli("run", str(protocol), "--out", str(out), "--ray", "--replicas", "2", "--resume")
    assert result.exit_code in (0, 1), result.output
    fleet = read_fleet(out)
    assert [(u.status, u.attempts) for u in fleet.units] == [("finished", 1), ("finished", 2)]
    rows = timing_keys(out / second.run)
    assert rows[: len(kept)] == kept and len(rows) == len(set(rows)) == 2 * 2 * 2  # cases x rounds x arms
    assert "--resume" in (out / second.log).read_text()
    assert verify_one(out).ok, failed(out)


def rewrite_fleet(root: Path, change) -> None:
    record = json.loads((root / "fleet.json").read_text())
    change(record)
    (root / "fleet.json").write_text(json.dumps(record))


def test_verify_catches_a_tampered_unit(shard_copy):
    timings = shard_copy / "workers" / "shard-2" / "timings.csv"
    lines = timings.read_text().splitlines()
    head, *rows = lines
    fields = rows[0].split(",")
    fields[6] = str(int(fields[6]) // 2)  # ns: a sample made twice as fast
    timings.write_text("\n".join([head, ",".join(fields), *rows[1:]]) + "\n")
    assert any(name.startswith("shard-2: ") for name in failed(shard_copy))


def test_verify_catches_tampered_combined_figures(shard_copy):
    rewrite_fleet(shard_copy, lambda r: r["combined"]["cases"][0]["speedups"].__setitem__(0, 9.0))
    assert "combined figures" in failed(shard_copy)
    rewrite_fleet(shard_copy, lambda r: r["combined"]["arms"][0].__setitem__("passed_in_every_unit", False))
    assert "kerneltrial" in failed(shard_copy)["combined figures"]


def test_verify_catches_a_shard_set_that_repeats_or_misses_a_case(shard_copy):
    rewrite_fleet(shard_copy, lambda r: r["units"][1].__setitem__("case_indices", [0]))
    problems = failed(shard_copy)
    assert "more than once [0]" in problems["fleet coverage"] and "missing [1]" in problems["fleet coverage"]
    assert "shard-2 ran cases" in problems["fleet pieces"]


def test_verify_catches_a_dropped_shard_and_an_unlisted_run(shard_copy):
    rewrite_fleet(shard_copy, lambda r: r.update(units=r["units"][:1], requested=1))
    problems = failed(shard_copy)
    assert "missing [1]" in problems["fleet coverage"]
    assert "runs no unit lists: shard-2" in problems["fleet units"]


def test_verify_catches_a_unit_whose_device_is_not_its_runs(shard_copy):
    rewrite_fleet(shard_copy, lambda r: r["units"][0].update(device="NVIDIA H200", device_uuid="GPU-planted"))
    problems = failed(shard_copy)["fleet devices"]
    assert "shard-1 lists device 'NVIDIA H200'" in problems and "does not allow mixed devices" in problems


def test_verify_catches_replica_order_seeds_that_repeat(replicas, tmp_path):
    copy = tmp_path / "fleet"
    shutil.copytree(replicas, copy)
    rewrite_fleet(copy, lambda r: r["units"][1].__setitem__("order_seed", 6))
    problems = failed(copy)
    assert "order seeds [6, 6] are not [6, 7]" in problems["fleet coverage"]
    assert "replica-2 ran order seed 7, listed 6" in problems["fleet pieces"]


def test_a_worker_on_another_device_model_refuses_its_unit(tmp_path):
    piece = write_protocol(tmp_path / "piece.toml", PROTOCOL)
    outcome = run_unit(str(piece), str(tmp_path / "run"), str(tmp_path / "log"), "NVIDIA H200", "aside", None)
    assert outcome.exit_code is None and "is not the fleet's 'NVIDIA H200'" in outcome.refused
    assert not (tmp_path / "run").exists()


def test_a_piece_rebases_the_protocols_paths_onto_its_folder(tmp_path):
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "k.py").write_text("")
    parent = tomllib.loads(PROTOCOL) | {"impl_modules": ["kernels/k.py", "some.module"]}
    fleet = tmp_path / "out" / "pieces"
    unit = Unit(id="shard-2", case_indices=[1], order_seed=9)
    piece = tomllib.loads(piece_text(parent, unit, tmp_path, fleet))
    assert piece["cases"] == [parent["cases"][1]] and piece["order_seed"] == 9
    assert (fleet / piece["impl_modules"][0]).resolve() == (tmp_path / "kernels" / "k.py").resolve()
    assert piece["impl_modules"][1] == "some.module"
    protocol = write_protocol(
        tmp_path / "fleet.toml", 'impl_modules = ["kernels/k.py"]\ncalibration_run = "calibrated"\n' + PROTOCOL
    )
    [module, calibration] = path_digests(protocol, tomllib.loads(protocol.read_text()), fleet)
    assert (module.key, module.path, module.piece_path) == ("impl_modules[0]", "kernels/k.py", piece["impl_modules"][0])
    assert module.sha256 == sha256_file(tmp_path / "kernels" / "k.py")
    assert calibration.key == "calibration_run" and calibration.sha256 is None  # no such run directory


def test_the_fault_hook_is_inert_without_the_testing_switch(monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "shard-2:3")
    monkeypatch.delenv(TESTING_ENV, raising=False)
    assert _faults() == {}
    monkeypatch.setenv(TESTING_ENV, "1")
    assert _faults() == {"shard-2": 3}


def test_ray_without_ray_installed_says_how_to_install_it(protocol, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    result = run_cli("run", str(protocol), "--out", str(tmp_path / "f"), "--ray", "--replicas", "2")
    assert result.exit_code == 2 and result.output.strip().splitlines() == [
        "error: --ray needs Ray, which is not installed: pip install 'kerneltrial[ray]'"
    ]
    assert not (tmp_path / "f").exists()


def test_fleet_flags_go_with_ray(protocol, tmp_path):
    result = run_cli("run", str(protocol), "--out", str(tmp_path / "f"), "--replicas", "2")
    assert result.exit_code == 2 and "go with --ray" in result.output


def test_a_worker_reads_the_gpu_ray_gave_it_not_gpu_0(monkeypatch, tmp_path):
    """nvidia-smi numbers every GPU of the machine: with CUDA_VISIBLE_DEVICES=1 (a Ray task's
    second GPU) the clocks and the device model are GPU 1's, asked for with `-i 1`."""
    from kerneltrial.fleet.worker import identity
    from kerneltrial.rundir import provenance

    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        '#!/bin/sh\nif [ "$1" = "-i" ]; then echo "GPU $2, GPU-uuid-$2"; else echo "GPU 0, GPU-uuid-0"; echo "GPU 1, GPU-uuid-1"; fi\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    assert provenance.visible_gpu() == "1" and (identity().device, identity().uuid) == ("GPU 1", "GPU-uuid-1")
    assert provenance.clocks()["clocks.sm"] == "GPU 1"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert provenance.clocks()["clocks.sm"] == "GPU 0"


def plant_provenance(run_dir: Path, **changes: Any) -> None:
    record = json.loads((run_dir / "provenance.json").read_text())
    record.update(changes)
    (run_dir / "provenance.json").write_text(json.dumps(record))


@pytest.mark.slow
def test_a_unit_started_on_another_chip_is_set_aside_and_run_afresh(cluster, shard_copy, protocol):
    """shard-2's partial run was started on another host and GPU (planted): `--resume` must not
    continue it there (two chips' rows in one run); it is moved aside, listed, and rerun."""
    run = shard_copy / "workers" / "shard-2"
    device = json.loads((run / "provenance.json").read_text())["device"]
    plant_provenance(run, finished_at=None, hostname="other-host", device=device | {"uuid": "GPU-planted"})
    planted = timing_keys(run)

    def unfinished(record: dict[str, Any]) -> None:
        record["units"][1].update(status="failed", error="planted")
        record.update(finished_at=None, combined=None)

    rewrite_fleet(shard_copy, unfinished)
    result = run_cli("run", str(protocol), "--out", str(shard_copy), "--ray", "--shard", "cases", "--resume")
    assert result.exit_code in (0, 1), result.output
    fleet = read_fleet(shard_copy)
    second = fleet.units[1]
    assert (second.status, second.attempts) == ("finished", 2) and fleet.units[0].attempts == 1
    [aside] = second.abandoned
    assert aside.path == "abandoned/shard-2-attempt2"
    assert "GPU GPU-planted of host other-host" in aside.reason
    moved = shard_copy / aside.path
    assert json.loads((moved / "provenance.json").read_text())["hostname"] == "other-host"
    assert timing_keys(moved) == planted  # the set-aside rows, untouched
    assert json.loads((run / "provenance.json").read_text())["hostname"] != "other-host"  # a fresh run
    assert "not resumed, moved to" in (shard_copy / second.log).read_text()
    assert verify_one(shard_copy).ok, failed(shard_copy)
    result = run_cli("report", str(shard_copy))
    assert (
        result.exit_code == 0
        and "abandoned/shard-2-attempt2: it was started on GPU" in (shard_copy / "report.md").read_text()
    )
    rewrite_fleet(shard_copy, lambda r: r["units"][1].update(abandoned=[]))  # the set-aside run unlisted
    assert "abandoned/ holds ['abandoned/shard-2-attempt2']" in failed(shard_copy)["fleet units"]


def test_more_replicas_than_gpus_are_refused(cluster, protocol, tmp_path, monkeypatch):
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"GPU": 1.0, "CPU": 2.0})
    result = run_cli("run", str(protocol), "--out", str(tmp_path / "f"), "--ray", "--replicas", "2")
    assert result.exit_code == 2 and "--replicas 2 needs 2 GPUs, one per replica; the cluster has 1" in result.output, (
        result.output
    )
    assert not (tmp_path / "f").exists()


def test_verify_catches_replicas_that_shared_a_gpu(replicas, tmp_path):
    copy = tmp_path / "fleet"
    shutil.copytree(replicas, copy)
    for unit in ("replica-1", "replica-2"):
        run = copy / "workers" / unit
        device = json.loads((run / "provenance.json").read_text())["device"]
        plant_provenance(run, device=device | {"uuid": "GPU-same"})
    rewrite_fleet(copy, lambda r: [u.update(device_uuid="GPU-same") for u in r["units"]])
    assert failed(copy)["fleet devices"] == "replicas replica-1, replica-2 ran on one GPU, GPU-same"


def test_verify_catches_a_piece_naming_another_file(shard_copy, tmp_path):
    """The protocol names a rule and a user module; shard-1's piece (and so its run's protocol)
    names another rule file, shard-2's run loaded a module whose sha256 is not the one planned."""
    rule, other, module = tmp_path / "rule.json", tmp_path / "other-rule.json", tmp_path / "k.py"
    for path in (rule, other, module):
        path.write_text(path.name)
    paths = {"impl_modules": [str(module)], "rule": {"path": str(rule), "sha256": sha256_file(rule)}}
    parent = tomllib.loads((shard_copy / "protocol.toml").read_text()) | paths
    (shard_copy / "protocol.toml").write_text(tomli_w.dumps(parent))
    recorded = [
        {"key": "impl_modules[0]", "path": str(module), "piece_path": str(module), "sha256": sha256_file(module)},
        {"key": "rule.path", "path": str(rule), "piece_path": str(rule), "sha256": sha256_file(rule)},
    ]
    rewrite_fleet(shard_copy, lambda r: r.update(paths=recorded))
    for unit, rule_path in (("shard-1", other), ("shard-2", rule)):
        ran = tomllib.loads((shard_copy / "workers" / unit / "protocol.toml").read_text())
        ran |= {**paths, "rule": {**paths["rule"], "path": str(rule_path)}}
        text = tomli_w.dumps(ran)
        (shard_copy / "workers" / unit / "protocol.toml").write_text(text)
        (shard_copy / "pieces" / f"{unit}.toml").write_text(text)
    plant_provenance(shard_copy / "workers" / "shard-2", impl_modules={str(module): "0" * 64})
    problems = failed(shard_copy)["fleet pieces"]
    assert f"shard-1 ran paths [('impl_modules[0]', '{module}'), ('rule.path', '{other}')]" in problems
    assert f"shard-2 loaded ['{module}'] with other sha256" in problems
    assert "shard-2 ran paths" not in problems and "differs from the fleet's" not in problems
