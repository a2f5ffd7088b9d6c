"""GPU memory images: CUDA GPU core dumps as device address spaces joined to a host image.

`cudacore` parses the file, `space` serves its global memory as an AddressSpace, `join` attaches
the devices' memory to the host process's space (`AddressSpace.device_space("cuda:0")`).
"""

from zen.memory.gpu.join import attach_gpu_images
from zen.memory.gpu.space import GpuCoreSpace, GpuLimits, sniff_gpu_core

__all__ = ["GpuCoreSpace", "GpuLimits", "attach_gpu_images", "sniff_gpu_core"]
