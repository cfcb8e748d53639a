"""What a map's durable copies say, read without running its queries: the checkpoints'
offsets, the Delta table and the changelog tail as the state Redis should hold, and
whether Kafka still has the records the map has not read.

The run reads them to restore a lost Redis copy and to notice lost source records
before it folds; the operator commands (``rehydrate``, ``verify``, ``reset-offsets``)
read them too. Nothing here starts a streaming query.
"""
