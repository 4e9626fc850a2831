"""persistkit adapter for langgraph (in progress)."""
