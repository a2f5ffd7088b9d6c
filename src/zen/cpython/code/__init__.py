"""Code objects: bytecode decoding, version-normalised listings, canonical marshal, rebuilding code objects."""
