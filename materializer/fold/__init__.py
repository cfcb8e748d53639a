"""The fold modes' semantics: what Spark computes per record (order, entity, payload) and
what is applied per key (``latest``, ``merge``, ``aggregate``). Where the fold runs is
``materializer.redis``; what it means is here.
"""
