"""The cluster side: the `kernelrl` CLI and its typed config, and by job the bus, the broker, weight transport, the
`up` launcher, the built-in models and the offline task pipeline."""
