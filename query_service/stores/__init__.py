"""Backends the query service reads maps from; ``base.MapStore`` is the boundary."""
