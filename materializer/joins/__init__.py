"""The lookup join of events with maps, shared by Enrich and the streaming enrichments."""
