"""A map's Delta side: the changelog topic MERGEd into the map's table by a query of its
own, the merge engines, the history table, and retention of rows not updated for a while.
"""
