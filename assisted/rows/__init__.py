"""B rows per forward: `generate_batch` / `generate_batch_iter` (batched.py), the rows engine (batch_engine.py),
each row's inputs checked at admission (batch_rows.py) and the batch's statistics (batched_stats.py)."""
