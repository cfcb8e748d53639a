"""What the operator commands do to a map outside its running queries: rehydrate and verify
its Redis copy, rebuild it into a new generation, replay a range, reset its offsets.

They read the durable copies through ``recovery`` and, where they fold events again,
start the map's queries through ``pipeline``.
"""
