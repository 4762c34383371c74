"""The DeepSpeed PPO learner: ingest of trajectories (exactly once), the stage schedule, the objective, checkpoints
and weight publishing."""
