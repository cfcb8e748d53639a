"""Reads of the maps' Delta tables: the latest snapshots and the offsets they reflect, rows as
entity JSON, page tokens, time travel."""
