"""A deployed model that looks like a CUDA deployment to a memory reader, with its ground truth.

Run: python gpu_layout_target.py OUTDIR [--simulate-cuda | --libcuda-only]
The model has what GPU deployments have: fp32 convolutions and linears, a bf16 embedding, an fp16 linear, an int64
buffer, tied weights (one Parameter under two keys), and a buffer that is a view at an offset into another tensor's
storage. It serves one request and writes OUTDIR/truth.json (every state_dict tensor's sha256, dtype, shape, and
TensorImpl/StorageImpl addresses) and request/response.safetensors.

With --simulate-cuda the process then makes its own memory look like a CUDA process's (CI has no GPU): every
StorageImpl's data pointer is moved to a device address (small storages packed into 2 MiB blocks, as PyTorch's
caching allocator packs them), every TensorImpl says cuda:0, the host copies of the bytes are overwritten, and the
bytes are kept in OUTDIR/device-memory.nvcudmp, a GPU core in the driver's layout, which stands for the GPU. It
maps a file named libcuda.so.1 (as a CUDA process does), and when started with CUDA_ENABLE_USER_TRIGGERED_COREDUMP=1
it acts as the CUDA driver does: it listens on the named pipe (CUDA_COREDUMP_PIPE, else the driver's default name)
and, when a byte arrives, writes the GPU core to CUDA_COREDUMP_FILE in blocks, holding it open while it writes.
Nothing touches the moved tensors afterwards. Prints READY; waits on stdin.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import mmap
import os
import shutil
import socket
import sys
import threading
import time

import torch
from safetensors.torch import save_file
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
OUT = sys.argv[1]
SIMULATE = "--simulate-cuda" in sys.argv
DEVICE_BASE = 0x7F6E_0000_0000
BLOCK = 2 << 20
ALIGN = 512


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 16)
        self.half_proj = nn.Linear(16, 16).to(torch.float16)
        self.emb = nn.Embedding(32, 16).to(torch.bfloat16)
        self.out = nn.Linear(16, 32, bias=False)
        self.out.weight = self.emb2 = nn.Parameter(torch.randn(32, 16))  # tied: two keys, one tensor
        table = torch.arange(64, dtype=torch.int64)
        self.register_buffer("ids", table)
        self.register_buffer("ids_tail", table[40:])  # a view at storage offset 40 of `ids`' storage
        self.register_buffer("scale", torch.tensor([0.5]))

    def forward(self, x):
        h = torch.relu(self.bn(self.conv(x))).mean((2, 3))
        h = self.head(h)
        h = h + self.half_proj(h.half()).float() + self.emb(self.ids_tail[:1] - 40).float()
        return self.out(h) * self.scale


def layout(storages: dict[int, int]) -> dict[int, int]:
    """Device address per StorageImpl (storage -> nbytes), packed like the caching allocator's blocks."""
    out, block, pos = {}, DEVICE_BASE, 0
    for st, nbytes in sorted(storages.items()):
        if nbytes > BLOCK // 2:
            block += BLOCK
            out[st] = block
            block += (nbytes + BLOCK - 1) // BLOCK * BLOCK
            pos = 0
            continue
        if pos + nbytes > BLOCK:
            block, pos = block + BLOCK, 0
        out[st] = block + pos
        pos += (nbytes + ALIGN - 1) // ALIGN * ALIGN
    return out


def simulate_cuda(tensors: dict) -> None:
    from zen.frontends.pytorch.profile import load_torch_profile
    from zen.memory.gpu.writer import Range, write_gpu_core

    P = load_torch_profile(".".join(torch.__version__.split("+")[0].split(".")[:2]))
    storages = {v["storage"]: (v["storage_ptr"], v["storage_nbytes"]) for v in tensors.values()}
    where = layout({st: n for st, (_, n) in storages.items()})
    ranges = [Range(where[st], n, ctypes.string_at(ptr, n)) for st, (ptr, n) in storages.items()]
    write_gpu_core(os.path.join(OUT, "device-memory.nvcudmp"), ranges,
                   devices=[{"devName": "Simulated GPU", "smType": "sm_90", "numSMs": 4, "smMajor": 9,
                             "contexts": [{"contextId": 1, "tid": os.getpid()}]}])  # fmt: skip
    for st, (ptr, n) in storages.items():
        ctypes.memset(ptr, 0xA5, n)  # the host copy is gone: only "device memory" has the bytes
        ctypes.c_uint64.from_address(st + P.storageimpl.data).value = where[st]
        ctypes.c_uint8.from_address(st + P.storageimpl.device_type).value = 1
    for v in tensors.values():
        ctypes.c_uint8.from_address(v["impl"] + P.tensorimpl.device_type).value = 1  # DeviceType::CUDA
        ctypes.c_int8.from_address(v["impl"] + P.tensorimpl.device_index).value = 0
    map_libcuda()
    if os.environ.get("CUDA_ENABLE_USER_TRIGGERED_COREDUMP") == "1":
        threading.Thread(target=driver, daemon=True).start()


def map_libcuda() -> None:
    """A CUDA process maps the driver library (a CUDA build of torch maps it even when no tensor is on a GPU)."""
    with open(os.path.join(OUT, "libcuda.so.1"), "wb") as fh:
        fh.write(b"\0" * mmap.PAGESIZE)
    with open(os.path.join(OUT, "libcuda.so.1"), "rb") as fh:
        globals()["_libcuda_map"] = mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ)


def driver() -> None:
    """What the CUDA driver does for a user-triggered dump (as far as a collector can see)."""
    pid, host = str(os.getpid()), socket.gethostname()
    pipe = os.environ.get("CUDA_COREDUMP_PIPE") or f"corepipe.cuda.{host}.{pid}"
    pipe = pipe.replace("%p", pid).replace("%h", host)
    os.mkfifo(pipe)
    with open(pipe, "rb") as fh:  # the driver holds its pipe open for reading
        while not fh.read(1):
            time.sleep(0.05)
    target = os.environ.get("CUDA_COREDUMP_FILE") or f"core_{int(time.time())}_{host}_{pid}.nvcudmp"
    target = target.replace("%p", pid).replace("%h", host).replace("%t", str(int(time.time())))
    with open(os.path.join(OUT, "device-memory.nvcudmp"), "rb") as src, open(target, "wb") as dst:
        while block := src.read(64 << 10):
            dst.write(block)
            dst.flush()
            time.sleep(0.01)  # a dump takes time: a collector must wait for the file to be complete
    if "skip_abort" not in os.environ.get("CUDA_COREDUMP_GENERATION_FLAGS", ""):
        os.abort()


model = Net().eval()
request = torch.randn(2, 3, 8, 8)
with torch.no_grad():
    response = model(request)
save_file({"x": request}, os.path.join(OUT, "request.safetensors"))
save_file({"x": response.contiguous()}, os.path.join(OUT, "response.safetensors"))

tensors = {}
for k, t in model.state_dict(keep_vars=True).items():
    d = t.detach()
    raw = d.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    st = d.untyped_storage()
    tensors[k] = {"sha256": hashlib.sha256(raw).hexdigest(), "dtype": str(d.dtype).replace("torch.", ""),
                  "shape": list(d.shape), "impl": t._cdata, "storage": st._cdata, "storage_ptr": st.data_ptr(),
                  "storage_nbytes": st.nbytes(), "storage_offset": d.storage_offset()}  # fmt: skip
with open(os.path.join(OUT, "truth.json"), "w") as fh:
    json.dump({"pid": os.getpid(), "tensors": tensors, "torch": torch.__version__}, fh, indent=1)
if SIMULATE:
    simulate_cuda(tensors)
    shutil.copy(os.path.join(OUT, "device-memory.nvcudmp"), os.path.join(OUT, "device-memory.copy"))
elif "--libcuda-only" in sys.argv:
    map_libcuda()
print("READY", flush=True)
sys.stdin.read()
