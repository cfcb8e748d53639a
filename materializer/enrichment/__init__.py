"""Streaming enrichments: events joined with the maps and written back to Kafka."""
