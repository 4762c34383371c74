"""The Kafka broker itself: start the embedded one or a multi-node cluster, read its state, watch it,
fetch its distribution, mirror topics."""
