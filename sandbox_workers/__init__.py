"""The sandboxed oracle: compile workers, evaluation workers (CPU and CUDA backends), the trusted judge, the OS
sandbox and the reward."""
