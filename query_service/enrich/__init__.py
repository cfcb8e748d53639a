"""Enrichment joins: events joined with map entities by key (``EnrichService``).

``plan`` turns a join spec into rounds of lookups, ``join`` applies looked-up
entities to parsed events (pure, no store), ``batch`` reads the entities of
many requests in one store round trip per round, ``inbox`` reads a stream's
requests ahead of processing, and ``reference`` is the plain
one-lookup-at-a-time join that tests compare with.
"""
