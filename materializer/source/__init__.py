"""A record's way in: Spark's ``kafka`` source, the value decoded by its format, the
transforms applied, its entity key assigned, and every failure kept as data for the
dead-letter topic. Everything here is a stateless Spark stage of a map's query.
"""
