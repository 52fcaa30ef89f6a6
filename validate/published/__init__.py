"""Published training runs (shared/published-runs) against costmodel's predictions."""
