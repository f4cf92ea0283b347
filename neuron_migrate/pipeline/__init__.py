"""The per-file pipeline (read, check or fix, report), the process pool over files, and the result cache."""
