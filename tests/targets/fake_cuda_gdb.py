"""A stand-in for cuda-gdb in CI (no GPU): executes the batch commands zen gives (`-ex`, each on its own, as gdb runs
them), serving "device memory" from a GPU
core (ZEN_FAKE_DEVICE_MEMORY) as cuda-gdb serves it from the GPU. It understands exactly the commands real cuda-gdb
was seen to accept on an H200 (README 'Models on GPUs'); any other command is an error, so the script zen writes is
checked command by command. Usage as cuda-gdb's: fake_cuda_gdb.py -nx -batch -p PID -ex CMD -ex CMD ...
"""

import os
import re
import sys

from zen.memory.gpu import GpuCoreSpace

args = sys.argv[1:]
pid = int(args[args.index("-p") + 1])
commands = [args[i + 1] for i, a in enumerate(args) if a == "-ex"]
os.kill(pid, 0)  # attaching needs the process
KNOWN = {"set pagination off", "set confirm off", "set max-value-size unlimited", "set print thread-events off", "detach", "quit"}
DUMP = re.compile(r"^dump binary value (\S+) \*\(@global unsigned char \(\*\)\[(\d+)\]\)(0x[0-9a-f]+)$")
mem = GpuCoreSpace(os.environ["ZEN_FAKE_DEVICE_MEMORY"])
failed = False
for line in commands:
    m = DUMP.match(line)
    if m:
        path, n, addr = m.group(1), int(m.group(2)), int(m.group(3), 16)
        try:
            data = mem.read(addr, n)
        except Exception as exc:  # like cuda-gdb: an error message, no file, go on
            print(f"Cannot access memory at address {addr:#x} ({exc})", file=sys.stderr)
            continue
        with open(path, "wb") as fh:
            fh.write(data)
    elif line == "info cuda devices":
        print("  Dev PCI Bus/Dev ID      Name Description SM Type SMs Warps/SM Lanes/Warp Max Regs/Lane Active SMs Mask")
        print("*   0        00:00.0 Simulated       sm_90   4       64         32           255 0x0")
    elif line not in KNOWN:
        print(f'Undefined command: "{line}".', file=sys.stderr)
        failed = True
sys.exit(1 if failed else 0)
