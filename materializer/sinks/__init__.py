"""Projections of folded state: each sink receives one micro-batch of final entity rows."""
