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
    "uid+read_search": (("uid",), uid),
    "root without caps": ((), 0),
}
for name, (pieces, who) in variants.items():
    program = [sys.executable, "-I", "-c", CHILD, handle]
    argv = confine.sandbox_argv(pieces, cg, who, name.endswith("read_search"), program)
    t0 = time.time()
    done = subprocess.run(argv, capture_output=True, text=True, cwd="/tmp")
    tail = (done.stdout + done.stderr).strip().splitlines()[-1:]
    print(f"{name:20s} rc={done.returncode} {time.time() - t0:.1f}s {tail}")
torch.cuda.synchronize()
print("harness sees", x[:2].tolist())
cg.rmdir()

# ---- the alternative: a VMM allocation exported as a POSIX file descriptor, passed to the worker
VMM_CHILD = """
import sys, torch
from cuda.bindings import driver as cu
fd, size = int(sys.argv[1]), int(sys.argv[2])
torch.cuda.init(); torch.zeros(1, device='cuda'); torch.cuda.synchronize()
H = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
err, h = cu.cuMemImportFromShareableHandle(fd, H); assert err == 0, err
err, ptr = cu.cuMemAddressReserve(size, 0, 0, 0); assert err == 0, err
err, = cu.cuMemMap(ptr, size, 0, h, 0); assert err == 0, err
acc = cu.CUmemAccessDesc(); acc.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE; acc.location.id = 0
acc.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
err, = cu.cuMemSetAccess(ptr, size, [acc], 1); assert err == 0, err
class A:
    __cuda_array_interface__ = {"shape": (size // 4,), "typestr": "<f4", "data": (int(ptr), False), "version": 3}
t = torch.as_tensor(A(), device="cuda"); t.add_(2); torch.cuda.synchronize(); print("vmm opened", t[:2].tolist())
"""
try:
    from cuda.bindings import driver as cu

    torch.cuda.synchronize()
    H = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = 0
    prop.requestedHandleTypes = H
    err, gran = cu.cuMemGetAllocationGranularity(prop, cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM)
    size = int(gran)
    err, h = cu.cuMemCreate(size, prop, 0); print("create", err)
    err, fd = cu.cuMemExportToShareableHandle(h, H, 0); print("export", err, fd)
    err, ptr = cu.cuMemAddressReserve(size, 0, 0, 0)
    cu.cuMemMap(ptr, size, 0, h, 0)
    acc = cu.CUmemAccessDesc(); acc.location.type = prop.location.type; acc.location.id = 0
    acc.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    print("access", cu.cuMemSetAccess(ptr, size, [acc], 1))

    class A:
        __cuda_array_interface__ = {"shape": (size // 4,), "typestr": "<f4", "data": (int(ptr), False), "version": 3}

    y = torch.as_tensor(A(), device="cuda")
    y.zero_()
    torch.cuda.synchronize()
    cg.mkdir(exist_ok=True)
    full = ("uid", "pidns", "cgroup", "no_new_privs", "seccomp")
    argv = confine.sandbox_argv(full, cg, uid, False, [sys.executable, "-I", "-c", VMM_CHILD, str(int(fd)), str(size)])
    done = subprocess.run(argv, capture_output=True, text=True, cwd="/tmp", pass_fds=(int(fd),))
    print("vmm full sandbox rc", done.returncode, (done.stdout + done.stderr).strip().splitlines()[-3:])
    torch.cuda.synchronize()
    print("harness sees", y[:2].tolist())
    cg.rmdir()
except Exception as exc:  # a probe: print what failed
    print("vmm probe failed:", type(exc).__name__, exc)
