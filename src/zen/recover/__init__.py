"""`zen recover` and `zen info`: the command's stages, its parallel jobs, the code stage, and its bounds."""
