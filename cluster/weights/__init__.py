"""Moving model weights from the learner to the actors: transports (bus, stream, shared files),
buckets, and the weights benchmark."""
