"""Python rule modules: every module in this package is imported by the registry (one rule family each)."""
