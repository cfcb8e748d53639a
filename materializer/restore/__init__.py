"""One restore of a map's Redis copy: the state it should hold, read from the Delta table
and the changelog tail, written back in bulk, by the run itself when a server lost the
map (``automatic``) or by an operator (``rehydrate``); ``verify`` compares against it.
Nothing here starts a streaming query.
"""
