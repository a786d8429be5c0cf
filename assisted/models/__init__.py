"""assisted.models."""
