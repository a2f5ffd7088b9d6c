"""The model's own code (ZEN Fig. 1): its closure, execution context, the PR and the system code table."""
