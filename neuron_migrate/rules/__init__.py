"""Rules: the data model, the rule API, the registry, the runner, and the rule modules (`builtin/`)."""
