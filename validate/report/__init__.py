"""Results (JSONL rows), the report and its charts. Torch-free: the app reads it."""
