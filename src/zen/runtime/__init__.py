"""The process plumbing every stage shares: errors and exit codes, consoles, child processes, forking, leaving."""
