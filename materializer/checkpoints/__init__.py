"""Streaming checkpoints: what a query's checkpoint says about itself, its files read (and,
for offset resets, edited) without Spark, and the source records it still needs that
Kafka no longer holds.
"""
