"""Compiled DNN executables (TVM-built model libraries): static parse, probing in a child, rebuild.

Flow: elf (find the module blob and kernel symbols) -> tvm_blob (module container) ->
vm_executable (functions, constants, bytecode) -> graph (kernel calls with shapes and weights) ->
probing/probe (operators and attributes measured in a child process with TVM) -> codegen (PyTorch
package). Only `probe` imports TVM or torch, and it only runs as a child process.
"""
