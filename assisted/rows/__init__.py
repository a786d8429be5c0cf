"""assisted.rows."""
