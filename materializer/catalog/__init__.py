"""Maps managed at runtime: kept in a compacted Kafka topic, combined with the file's.

``store`` reads and writes the topic, ``rule`` says which maps are in force,
``changes`` checks a change before it is stored. Shared by ``materializer run``
(which starts, restarts and stops what changed), the query service (which serves
what is in force and takes changes through its admin API) and ``materializer maps``.
"""
