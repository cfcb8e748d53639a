"""What runs a map's queries: each micro-batch handed to its sinks (``projector``), the
queries of a map as one unit, the session's listener, progress lines, metrics, the
control channel with operators, crash drills, the topics a map writes, and the
consumer group its offsets are committed to.
"""
