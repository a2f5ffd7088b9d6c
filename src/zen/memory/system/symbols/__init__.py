"""Kernel symbols for whole-machine images: Volatility 3 ISFs built from the kernel's own BTF.

`build` makes an ISF from a vmlinuz/vmlinux (`kernelfile`: decompression, `.BTF`, banner), its
embedded kallsyms table (`kallsyms_table`) or a System.map / /proc/kallsyms copy (`kallsyms`),
converted by `isf` (types from `btfparse`, declared types of globals from `globals_table`);
`lookup` finds the ISF whose banner matches an image, through an index of the files it has seen.
"""
