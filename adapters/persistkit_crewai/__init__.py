"""persistkit adapter for crewai (in progress)."""
