"""assisted.jobs."""
