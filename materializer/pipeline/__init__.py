"""The streaming side: Kafka source, decoding, the fold, and the queries that run them."""
