"""The evidence's own bookkeeping: image digests, the digest cache, and where outputs may be written."""
