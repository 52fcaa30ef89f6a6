"""The engine: every quantity's expression compiled once per structure (``quantities``),
evaluated exactly for one configuration (``estimate``) or over numpy grids (``sweep``),
and inverse questions over the same numbers (``inverse``)."""
