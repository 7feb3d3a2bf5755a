"""Issue 7m's diagnosis scripts, kept as they ran (results/diag-7m.md)."""
