"""Which sandbox pieces let a worker open the harness's CUDA IPC handles (issue 35).
Run on the device machine as root: python3 scripts/device/ipc_probe.py"""

import json
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[2] / "src"))
from kerneltrial.trial import confine  # noqa: E402
from kerneltrial.trial.shared import cuda_handle  # noqa: E402

CHILD = """
import json, sys, torch
d = json.loads(sys.argv[1])
torch.cuda._lazy_init()
s = torch.UntypedStorage._new_shared_cuda(d[0], bytes.fromhex(d[1]), d[2], d[3], bytes.fromhex(d[4]), d[5],
    None if d[6] is None else bytes.fromhex(d[6]), d[7])
t = torch.empty(0, dtype=torch.float32, device='cuda').set_(s)
t.add_(1); torch.cuda.synchronize(); print('opened', t[:2].tolist())
"""

x = torch.zeros(1024, device="cuda")
handle = json.dumps(cuda_handle(x.untyped_storage()))
root = confine.cgroup2_root()
cg = root / "kt-ipc-probe"
cg.mkdir(exist_ok=True)
uid = confine.free_uid(set())
variants = {
    "none": ((), None),
    "no_new_privs": (("no_new_privs",), None),
    "cgroup": (("cgroup",), None),
    "seccomp": (("seccomp",), None),
    "pidns": (("pidns",), None),
    "uid": (("uid",), uid),
    "root without caps": ((), 0),
}
for name, (pieces, who) in variants.items():
    program = [sys.executable, "-I", "-c", CHILD, handle]
    argv = confine.sandbox_argv(pieces, cg, who, program)
    t0 = time.time()
    done = subprocess.run(argv, capture_output=True, text=True, cwd="/tmp")
    tail = (done.stdout + done.stderr).strip().splitlines()[-1:]
    print(f"{name:20s} rc={done.returncode} {time.time() - t0:.1f}s {tail}")
torch.cuda.synchronize()
print("harness sees", x[:2].tolist())
cg.rmdir()

# The alternative that crosses uids, a VMM allocation passed as a file descriptor, is trial/vmm.py
# (results/h200/sandbox-2026-12-04/ipc_probe.log holds this probe's first form, which tried it
# inline: "vmm full sandbox rc 0"); tests/trial/test_isolation.py runs it on a GPU.
