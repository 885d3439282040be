"""Agent sessions with context management, generators, trace loaders."""
