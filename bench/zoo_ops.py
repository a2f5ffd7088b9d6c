"""Reference CPU kernels for torchvision's two C++ detection ops, for the zoo sweep only.

PyPI's torchvision 0.28.0 is a CUDA build: with the CPU torch its `_C.so` does not load, so
`torchvision::nms` and `torchvision::roi_align` have no kernel and every detection model fails in
its post-processing (nms) or its RoI heads (roi_align). These are plain-torch versions written
from the ops' documented semantics (greedy NMS suppressing IoU > threshold, highest score first;
RoIAlign with bilinear sampling, `sampling_ratio` samples per bin or an adaptive count, the
`aligned` half-pixel shift). The deployed model and both rebuilds run on the same kernels, so the
bit-for-bit comparison of their outputs is unaffected by how close these are to the C++ ones.
"""

from __future__ import annotations

import math

import torch


def nms(dets: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """Indices of the boxes kept, by decreasing score (boxes as x1, y1, x2, y2)."""
    if dets.numel() == 0:
        return torch.empty(0, dtype=torch.long, device=dets.device)
    x1, y1, x2, y2 = dets.unbind(1)
    areas = (x2 - x1) * (y2 - y1)
    order = scores.argsort(descending=True, stable=True)
    suppressed = torch.zeros(dets.shape[0], dtype=torch.bool, device=dets.device)
    keep = []
    for i in order.tolist():
        if suppressed[i]:
            continue
        keep.append(i)
        w = (torch.minimum(x2[i], x2) - torch.maximum(x1[i], x1)).clamp(min=0)
        h = (torch.minimum(y2[i], y2) - torch.maximum(y1[i], y1)).clamp(min=0)
        inter = w * h
        suppressed |= inter / (areas[i] + areas - inter) > iou_threshold
    return torch.tensor(keep, dtype=torch.long, device=dets.device)


def _bilinear(feat: torch.Tensor, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """feat [C, H, W] sampled at the points (y, x) (1-D, same length): [C, N]; 0 outside."""
    H, W = feat.shape[-2:]
    outside = (y < -1.0) | (y > H) | (x < -1.0) | (x > W)
    y, x = y.clamp(min=0), x.clamp(min=0)
    y0, x0 = y.floor().long(), x.floor().long()
    ylast, xlast = y0 >= H - 1, x0 >= W - 1
    y0, x0 = torch.where(ylast, H - 1, y0), torch.where(xlast, W - 1, x0)
    y1, x1 = torch.where(ylast, H - 1, y0 + 1), torch.where(xlast, W - 1, x0 + 1)
    y, x = torch.where(ylast, y0.to(y.dtype), y), torch.where(xlast, x0.to(x.dtype), x)
    ly, lx = y - y0, x - x0
    hy, hx = 1 - ly, 1 - lx
    out = (hy * hx) * feat[:, y0, x0] + (hy * lx) * feat[:, y0, x1] + (ly * hx) * feat[:, y1, x0] + (ly * lx) * feat[:, y1, x1]
    return torch.where(outside, torch.zeros((), dtype=feat.dtype), out)


def roi_align(input: torch.Tensor, rois: torch.Tensor, spatial_scale: float, pooled_height: int, pooled_width: int,
              sampling_ratio: int, aligned: bool) -> torch.Tensor:  # fmt: skip
    """[K, C, pooled_height, pooled_width] for rois [K, 5] (batch index, x1, y1, x2, y2)."""
    K, C = rois.shape[0], input.shape[1]
    out = input.new_zeros((K, C, pooled_height, pooled_width))
    offset = 0.5 if aligned else 0.0
    for k in range(K):
        b, x1, y1, x2, y2 = rois[k].tolist()
        sx, sy = x1 * spatial_scale - offset, y1 * spatial_scale - offset
        rw, rh = x2 * spatial_scale - offset - sx, y2 * spatial_scale - offset - sy
        if not aligned:
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        bh, bw = rh / pooled_height, rw / pooled_width
        gh = sampling_ratio if sampling_ratio > 0 else math.ceil(rh / pooled_height)
        gw = sampling_ratio if sampling_ratio > 0 else math.ceil(rw / pooled_width)
        count = max(gh * gw, 1)
        iy = torch.arange(pooled_height * gh, dtype=input.dtype)
        ix = torch.arange(pooled_width * gw, dtype=input.dtype)
        ys = sy + (iy // gh) * bh + ((iy % gh) + 0.5) * bh / gh
        xs = sx + (ix // gw) * bw + ((ix % gw) + 0.5) * bw / gw
        yy, xx = ys.repeat_interleave(len(xs)), xs.repeat(len(ys))
        vals = _bilinear(input[int(b)], yy, xx).reshape(C, pooled_height, gh, pooled_width, gw)
        out[k] = vals.sum(dim=(2, 4)) / count
    return out


def has_ops() -> bool:
    """Stands in for `torchvision.extension._has_ops`, which says False when `_C.so` did not load."""
    return True


def register(lib: torch.library.Library) -> None:
    """Give the declared torchvision ops these CPU kernels (call before importing torchvision)."""
    lib.define("roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
               "int sampling_ratio, bool aligned) -> Tensor")  # fmt: skip
    lib.impl("nms", nms, "CPU")
    lib.impl("roi_align", roi_align, "CPU")
