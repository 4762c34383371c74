"""The Kafka bus: the client roles talk through (producer/consumer wrappers, RPC, serving), its topic
admin, lag and scan tools, replay, and the bus benchmark."""
