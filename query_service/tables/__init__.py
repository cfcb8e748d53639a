"""Reads of the maps' Delta tables: rows as entity JSON, page tokens, time travel."""
