"""The JSONL job behind `structspec batch`: resumable runs (batch.py), two-pass input reading (batch_input.py), the
output lock (batch_lock.py), Ray workers (ray_batch.py) and `BatchGenerator` for `Dataset.map_batches`
(distributed.py)."""
