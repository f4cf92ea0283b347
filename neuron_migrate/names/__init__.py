"""Name resolution: one `ast` pass per file binding names to qualified names per scope, and the sites rules match."""
