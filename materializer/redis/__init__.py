"""The fold applied where the map lives, Redis: each batch's records prepared by Spark,
applied per key by the Redis Functions library, the changelog produced from what was
applied, the watermark committed last; plus the map's expiry and fold-state size.
"""
