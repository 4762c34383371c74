"""The `kernelrl up`/`chaos` launcher: the run loop, role supervisor, task feeder, dashboard, end-of-run
report, and the process helpers it shares with the broker launcher."""
