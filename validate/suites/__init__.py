"""The cases ``python -m validate.run`` runs (accounting, attention, model, distributed)
and the runner that executes them, writing rows as they are measured."""
