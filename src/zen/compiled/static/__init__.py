"""Static parse of a compiled executable: the ELF payload, TVM's containers, the VM bytecode and kernel graph."""
