"""The host a serving calibration was measured on (issue 36, review A5): its fingerprint, the digest
of a local model folder, the identity rule the gate and verify share (a new hostname alone is a
warning, unread GPUs are unknown, not another host), and a trial refused when the weights changed."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from kerneltrial.serving import trial
from kerneltrial.serving.calibration import read_calibration
from kerneltrial.serving.calibration_host import (
    HUB_ID,
    Gpu,
    HostFingerprint,
    NotDigested,
    Weights,
    compare_hosts,
    cpu_model,
    describe_host,
    provenance_differences,
    provenance_host,
    read_gpus,
    this_host,
    weights_digest,
)
from kerneltrial.serving.verify import verify_serving_run
from tests.kt import run_cli, write_protocol

from .test_acceptance import synthetic_bench, trial_text
from .test_calibration import SMI_FAILED, fake_nvidia_smi, run_with

H100_A = Gpu(name="NVIDIA H100 80GB HBM3", uuid="GPU-aaaa", driver_version="550.54.15")
H100_B = Gpu(name="NVIDIA H100 80GB HBM3", uuid="GPU-bbbb", driver_version="550.54.15")
HOST = HostFingerprint(
    hostname="ct-1f2e",
    cpu_model="AMD EPYC 9654 96-Core Processor",
    cpu_count=192,
    memory_gib=1511,
    gpus=[H100_A, H100_B],
    cuda_visible_devices=None,
    weights=None,
)


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
    assert isinstance(first, Weights) and (first.files, first.total_bytes) == (2, 64 + 18)  # .cache left out
    (folder / ".cache" / "huggingface" / "model.safetensors.metadata").write_text("etag 1, fetched at 11:00")
    assert weights_digest(str(folder)) == first  # another download of the same weights
    (folder / "model.safetensors").write_bytes(b"\1" * 64)
    assert weights_digest(str(folder)) == first  # same name and size: not hashed (gigabytes), by design
    (folder / "model.safetensors").write_bytes(b"\0" * 65)
    resized = weights_digest(str(folder))
    assert isinstance(resized, Weights) and resized.listing_sha256 != first.listing_sha256
    (folder / "config.json").write_text('{"hidden_size": 9}')
    edited = weights_digest(str(folder))
    assert isinstance(edited, Weights) and edited.config_sha256 != resized.config_sha256
    single = weights_digest(str(folder / "model.safetensors"))  # a single-file model
    assert isinstance(single, Weights) and (single.files, single.config_sha256) == (1, None)
    assert weights_digest(None) is None


def test_a_hub_id_is_recorded_as_not_digested_and_printed_so():
    """Review item 3: a hub id left `weights` null, the same as no model at all; it now says so."""
    host = this_host("org/some-hub-model")
    assert host.weights == NotDigested(model="org/some-hub-model", note=HUB_ID)
    assert host.model_dump()["weights"] == {"model": "org/some-hub-model", "note": "hub id: weights not digested"}
    assert HostFingerprint.model_validate(host.model_dump()) == host  # it reads back as written
    assert describe_host(host).endswith("weights 'org/some-hub-model': hub id: weights not digested")
    undigested = compare_hosts(host, host)
    assert undigested.same and "weights not compared: 'org/some-hub-model': hub id: weights not digested" in (
        undigested.warnings
    )


def test_the_cpu_model_comes_from_cpuinfo_else_from_platform(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9654 96-Core Processor\n")
    assert cpu_model(info) == "AMD EPYC 9654 96-Core Processor"
    info.write_text("processor\t: 0\nCPU part\t: 0xd4f\n")  # an ARM host
    assert cpu_model(info) and cpu_model(tmp_path / "absent")


def test_the_gpus_are_read_or_the_reason_they_were_not_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert read_gpus().unread == "nvidia-smi is not on PATH" and read_gpus().gpus is None
    monkeypatch.setenv("PATH", str(fake_nvidia_smi(tmp_path / "broken", None)))
    assert read_gpus().unread == (
        "nvidia-smi exited 9: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    )
    monkeypatch.setenv("PATH", str(fake_nvidia_smi(tmp_path / "two", ["GPU-aaaa", "GPU-bbbb"])))
    assert read_gpus().gpus == [H100_A, H100_B] and read_gpus().unread is None
    assert this_host(None).gpus_unread is None and this_host(None).gpus == [H100_A, H100_B]


def test_a_new_hostname_alone_is_a_warning_and_the_hardware_decides():
    """Review item 1a: a container renamed on every start (same CPU, memory, GPUs) was refused."""
    renamed = compare_hosts(HOST, HOST.model_copy(update={"hostname": "ct-9a8b", "memory_gib": 1509}))
    assert renamed.same and renamed.differ == [] and renamed.unknown == []  # memory within 2%
    assert renamed.warnings == [
        "hostname 'ct-1f2e' there, 'ct-9a8b' here, on the same hardware: taken as the same machine under a new "
        "name (a container gets one on every start)"
    ]
    changes = [
        ({"cpu_model": "Intel Xeon Platinum 8480+"}, "cpu_model 'AMD EPYC 9654 96-Core Processor' there, 'Intel Xeon"),
        ({"cpu_count": 96}, "cpu_count 192 there, 96 here"),
        ({"memory_gib": 755}, "memory_gib 1511 there, 755 here (beyond the 2% tolerance)"),
        (
            {"gpus": [H100_A, H100_A.model_copy(update={"uuid": "GPU-cccc"})]},
            "gpus UUIDs ['GPU-aaaa', 'GPU-bbbb'] there",
        ),
        ({"gpus": [H100_A]}, "gpus UUIDs ['GPU-aaaa', 'GPU-bbbb'] there, ['GPU-aaaa'] here"),
        (
            {"gpus": [g.model_copy(update={"driver_version": "560.28.03"}) for g in (H100_A, H100_B)]},
            "gpus driver ['550.54.15'] there, ['560.28.03'] here",
        ),
    ]
    for update, named in changes:
        other = compare_hosts(HOST, HOST.model_copy(update={"hostname": "ct-9a8b", **update}))
        assert not other.same and len(other.differ) == 1 and other.differ[0].startswith(named), (update, other)
        assert other.warnings == ["hostname 'ct-1f2e' there, 'ct-9a8b' here"]  # not "the same hardware"
    # GPUs without UUIDs (an older trial's provenance.json): their models and count are compared
    nameless = [g.model_copy(update={"uuid": ""}) for g in (H100_A, H100_B)]
    assert compare_hosts(HOST, HOST.model_copy(update={"gpus": nameless})).same
    a100 = Gpu(name="NVIDIA A100-SXM4-80GB", uuid="", driver_version="550.54.15")
    assert compare_hosts(HOST, HOST.model_copy(update={"gpus": [a100, a100]})).differ == [
        "gpus models ['NVIDIA H100 80GB HBM3'] there, ['NVIDIA A100-SXM4-80GB'] here"
    ]
    assert compare_hosts(HOST, HOST.model_copy(update={"gpus": nameless[:1]})).differ == ["gpus 2 GPU(s) there, 1 here"]


def test_gpus_read_on_one_side_only_are_unknown_not_another_host():
    """Review item 1b: an nvidia-smi that failed at trial time read as "another host"."""
    unread = HOST.model_copy(update={"gpus": None, "gpus_unread": "nvidia-smi is not on PATH"})
    here = compare_hosts(HOST, unread)
    assert here.differ == [] and not here.same
    assert here.unknown == [
        "could not read the GPUs here: nvidia-smi is not on PATH (there: [NVIDIA H100 80GB HBM3 GPU-aaaa, "
        "NVIDIA H100 80GB HBM3 GPU-bbbb]); an unread GPU is not shown to be the one calibrated: make "
        "`nvidia-smi -L` list the GPUs and run the trial again"
    ]
    there = compare_hosts(unread.model_copy(update={"gpus_unread": None}), HOST)  # a /4 record from before the reason
    assert there.differ == [] and there.unknown[0].startswith(
        "could not read the GPUs there: no reason recorded (a calibration from before the reason was recorded) "
        "(here: [NVIDIA H100 80GB HBM3 GPU-aaaa"
    )
    assert there.unknown[0].endswith("calibrate again on this host with `nvidia-smi -L` listing the GPUs")
    neither = compare_hosts(unread, unread)
    assert neither.same and neither.warnings == [
        "GPUs not compared: they could not be read there (nvidia-smi is not on PATH) nor here "
        "(nvidia-smi is not on PATH)"
    ]


def test_cuda_visible_devices_names_the_gpus_each_side_saw():
    """Review item 1c: the message said only "'0' there, '1' here"."""
    calibrated = HOST.model_copy(update={"cuda_visible_devices": "0"})
    moved = compare_hosts(calibrated, HOST.model_copy(update={"cuda_visible_devices": "1"}))
    assert moved.differ == [
        "the calibration saw CUDA_VISIBLE_DEVICES=0 (NVIDIA H100 80GB HBM3 GPU-aaaa), the trial sees "
        "CUDA_VISIBLE_DEVICES=1 (NVIDIA H100 80GB HBM3 GPU-bbbb): the calibration's noise belongs to the GPUs it "
        "ran on; run the trial with CUDA_VISIBLE_DEVICES=0, or calibrate again with this setting"
    ]
    unset = compare_hosts(calibrated, HOST)
    assert unset.differ[0].startswith("the calibration saw CUDA_VISIBLE_DEVICES=0 (NVIDIA H100 80GB HBM3 GPU-aaaa), ")
    assert "the trial sees no CUDA_VISIBLE_DEVICES (every GPU)" in unset.differ[0]
    # the same GPU named by its index and by its UUID is the same device
    assert compare_hosts(calibrated, HOST.model_copy(update={"cuda_visible_devices": "GPU-aaaa"})).same


def test_provenance_records_the_hostname_gpus_and_devices_a_fingerprint_is_checked_against():
    there = HOST.model_copy(update={"gpus": [H100_A], "cuda_visible_devices": "1"})
    prov = {
        "hostname": "ct-1f2e",
        "gpu": [{"name": H100_A.name, "driver_version": "550.54.15", "pci.bus_id": "x"}],
        "environment": {"CUDA_VISIBLE_DEVICES": "1"},
    }
    assert provenance_differences(there, prov) == []
    assert provenance_differences(there, {**prov, "gpu": None, "environment": {}}) == [
        "GPUs (name, driver) [('NVIDIA H100 80GB HBM3', '550.54.15')] in calibration.json, [] in provenance.json",
        "CUDA_VISIBLE_DEVICES '1' in calibration.json, None in provenance.json environment",
    ]
    old, unrecorded = provenance_host(prov)  # a trial from before it recorded its fingerprint
    assert unrecorded == {"cpu_model", "cpu_count", "memory_gib", "weights"}
    assert (old.hostname, old.cuda_visible_devices, old.gpus) == (
        "ct-1f2e",
        "1",
        [H100_A.model_copy(update={"uuid": ""})],
    )
    assert compare_hosts(there, old, unrecorded).same
    assert (
        compare_hosts(there, provenance_host({**prov, "environment": {}})[0], unrecorded)
        .differ[0]
        .startswith(
            "the calibration saw CUDA_VISIBLE_DEVICES=1 (not among the GPUs read), the trial sees no CUDA_VISIBLE_DEVICES"
        )
    )


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


def test_a_calibration_of_a_hub_id_records_and_prints_that_its_weights_are_not_digested(tmp_path, monkeypatch):
    """Review item 3, end to end: `serve calibrate` of a hub id model records `weights` as not digested
    and verify prints it with the calibration's host (nvidia-smi failing: its reason too)."""
    monkeypatch.setenv("PATH", f"{fake_nvidia_smi(tmp_path / 'smi', None)}:{os.environ['PATH']}")
    model_folder(tmp_path)  # the client's tokenizer: nothing is downloaded here
    hub = 'model_id = "tiny"\nmodel = "org/some-hub-model"\ntokenizer = "weights"\n'
    text = trial_text(rounds=2).replace('model_id = "tiny"\n', hub)
    proto = write_protocol(tmp_path / "trial.toml", text)
    monkeypatch.setattr(trial, "run_bench", synthetic_bench(lambda arm, L: (1.0, 1.0)))
    args = ("serve", "calibrate", proto, "--launches", "2", "--vllm", sys.executable, "-q", "--out", tmp_path / "cal")
    assert run_cli(*args).exit_code == 1  # not passed (2 comparisons), still the record of its run
    recorded = json.loads((tmp_path / "cal" / "calibration.json").read_text())["host"]
    assert recorded["weights"] == {"model": "org/some-hub-model", "note": "hub id: weights not digested"}
    reason = f"nvidia-smi exited 9: {SMI_FAILED}"
    assert recorded["gpus"] is None and recorded["gpus_unread"].startswith(reason)
    check = next(c for c in verify_serving_run(tmp_path / "cal").checks if c.name == "calibration")
    assert check.ok, check.problems
    assert f"; measured on host {recorded['hostname']!r}: " in check.detail
    assert check.detail.endswith("weights 'org/some-hub-model': hub id: weights not digested")
    assert f"GPUs unread ({reason}" in check.detail
