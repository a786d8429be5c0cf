"""The decode engine for one row or many (engine.py), a row being decoded (row.py), each row's inputs set up once
(inputs.py) and the batch's statistics (stats.py)."""
