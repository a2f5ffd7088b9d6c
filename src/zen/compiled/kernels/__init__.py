"""Per-kernel probing work (run in the probing child): readings, search, fitting, evaluation, budgets."""
