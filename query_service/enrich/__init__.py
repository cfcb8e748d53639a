"""Enrich's lookup joins: events joined with map entities by key (``EnrichService``).

The join's semantics are the materializer's (``materializer.enrichment.plan``,
``materializer.enrichment.rounds``), so an event enriched here comes out as an enrichment job
would write it. Here: ``plan`` validates a request's lookups into those rounds,
``events`` parses a request's events for the join, ``batch`` reads the entities of many
requests in one store round trip per round, ``inbox`` reads a stream's requests
ahead of processing, ``errors`` names what a request got wrong, and
``reference`` is the plain one-lookup-at-a-time join that tests compare with.
"""
