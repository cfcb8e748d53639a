"""What the operator commands do to a map outside its running queries: rebuild it into a new
generation, replay a range, verify its Redis copy, reset its offsets.

They read the durable copies through ``checkpoints`` and ``restore`` and, where they
fold events again, start the map's queries through ``job``.
"""
