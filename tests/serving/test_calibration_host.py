"""The host a serving calibration was measured on (issue 36, review A5): its fingerprint, the digest
of a local model folder, and a trial refused when the weights changed since the calibration."""

from __future__ import annotations

import sys
from pathlib import Path

from kerneltrial.serving import trial
from kerneltrial.serving.calibration import read_calibration
from kerneltrial.serving.calibration_host import (
    Gpu,
    cpu_model,
    host_differences,
    provenance_differences,
    this_host,
    weights_digest,
)
from tests.kt import run_cli, write_protocol

from .test_acceptance import synthetic_bench, trial_text
from .test_calibration import run_with


def model_folder(root: Path) -> Path:
    folder = root / "weights"
    (folder / ".cache" / "huggingface").mkdir(parents=True)
    (folder / "config.json").write_text('{"hidden_size": 8}')
    (folder / "model.safetensors").write_bytes(b"\0" * 64)
    (folder / ".cache" / "huggingface" / "model.safetensors.metadata").write_text("etag 1, fetched at 10:00")
    return folder


def test_the_weights_digest_names_files_and_sizes_and_hashes_only_the_config(tmp_path):
    folder = model_folder(tmp_path)
    first = weights_digest(str(folder))
    assert first is not None and (first.files, first.total_bytes) == (2, 64 + 18)  # the hidden .cache left out
    (folder / ".cache" / "huggingface" / "model.safetensors.metadata").write_text("etag 1, fetched at 11:00")
    assert weights_digest(str(folder)) == first  # another download of the same weights
    (folder / "model.safetensors").write_bytes(b"\1" * 64)
    assert weights_digest(str(folder)) == first  # same name and size: not hashed (gigabytes), by design
    (folder / "model.safetensors").write_bytes(b"\0" * 65)
    resized = weights_digest(str(folder))
    assert resized is not None and resized.listing_sha256 != first.listing_sha256
    (folder / "config.json").write_text('{"hidden_size": 9}')
    edited = weights_digest(str(folder))
    assert edited is not None and edited.config_sha256 != resized.config_sha256
    single = weights_digest(str(folder / "model.safetensors"))  # a single-file model
    assert single is not None and (single.files, single.config_sha256) == (1, None)
    assert weights_digest("org/some-hub-model") is None and weights_digest(None) is None


def test_the_cpu_model_comes_from_cpuinfo_else_from_platform(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9654 96-Core Processor\n")
    assert cpu_model(info) == "AMD EPYC 9654 96-Core Processor"
    info.write_text("processor\t: 0\nCPU part\t: 0xd4f\n")  # an ARM host
    assert cpu_model(info) and cpu_model(tmp_path / "absent")


def test_host_differences_name_every_field_that_differs():
    here = this_host(None)
    assert host_differences(here, here) == []
    h100 = Gpu(name="NVIDIA H100 80GB HBM3", uuid="GPU-1", driver_version="550.54.15")
    there = here.model_copy(update={"hostname": "quieter-host", "gpus": [h100], "cuda_visible_devices": "1"})
    gpus = here.gpus
    assert host_differences(there, here) == [
        f"hostname 'quieter-host' there, {here.hostname!r} here",
        f"gpus [{h100.model_dump()!r}] there, {None if gpus is None else [g.model_dump() for g in gpus]!r} here",
        f"cuda_visible_devices '1' there, {here.cuda_visible_devices!r} here",
    ]
    other_card = there.model_copy(update={"gpus": [h100.model_copy(update={"uuid": "GPU-2"})]})
    assert host_differences(there, other_card) == ["gpus[0].uuid 'GPU-1' there, 'GPU-2' here"]
    prov = {"hostname": "quieter-host", "gpu": [{"name": h100.name, "driver_version": "550.54.15", "pci.bus_id": "x"}]}
    assert provenance_differences(there, prov) == []
    assert provenance_differences(there, {**prov, "gpu": None}) == [
        "GPUs (name, driver) [('NVIDIA H100 80GB HBM3', '550.54.15')] in calibration.json, [] in provenance.json"
    ]


def test_a_trial_is_refused_when_the_model_folder_changed_since_its_calibration(tmp_path, monkeypatch):
    """server.model a local folder (relative to the protocol): calibrated, then its config.json edited.
    The calibration (4 launches) need not pass: the host is checked before whether it passed."""
    model_folder(tmp_path)
    text = trial_text(rounds=2).replace('model_id = "tiny"\n', 'model_id = "tiny"\nmodel = "weights"\n')
    proto = write_protocol(tmp_path / "trial.toml", text)
    monkeypatch.setattr(trial, "run_bench", synthetic_bench(lambda arm, L: (1.0, 1.0)))
    args = ("serve", "calibrate", proto, "--launches", "2", "--vllm", sys.executable, "-q", "--out", tmp_path / "cal")
    assert run_cli(*args).exit_code == 1  # 2 comparisons cannot estimate the rate: not passed
    recorded = read_calibration(tmp_path / "cal").host
    assert recorded is not None and recorded.weights == weights_digest(str(tmp_path / "weights"))
    trial_toml = text.replace("[acceptance]\n", '[acceptance]\ncalibration = "cal"\n')
    (tmp_path / "same").mkdir()
    (tmp_path / "edited").mkdir()
    code, output, _ = run_with(proto, tmp_path / "same", trial_toml, monkeypatch)
    assert code == 2 and "acceptance.calibration 'cal' did not pass" in output, output  # the same host
    (tmp_path / "weights" / "config.json").write_text('{"hidden_size": 9}')  # the same size: only its hash differs
    code, output, out = run_with(proto, tmp_path / "edited", trial_toml, monkeypatch)
    assert code == 2 and not out.exists(), output
    assert "acceptance.calibration 'cal' was measured on another host (weights.config_sha256 '" in output
    assert "its noise band is not this host's; calibrate again on this host" in output
