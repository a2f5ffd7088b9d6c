"""CPython's layout as data: struct offsets per minor version, patch-release variants, debug offsets, symbols."""
