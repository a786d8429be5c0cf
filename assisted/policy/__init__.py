"""assisted.policy."""
