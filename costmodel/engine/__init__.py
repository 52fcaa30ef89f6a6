"""The engine: every quantity from the formulas (``quantities``), computed exactly for one
configuration (``estimate``) or over numpy grids (``sweep``),
and inverse questions over the same numbers (``inverse``)."""
