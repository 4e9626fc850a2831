"""persistkit adapter for openai_agents (in progress)."""
