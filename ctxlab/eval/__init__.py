"""Model use: RULER-style long-context tasks, scoring and effective context length."""
