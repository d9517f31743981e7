"""What every script shares: run plumbing (command line, checkpoints, seeding, run folders, logging,
evaluation episodes, Ctrl-C, env ids), the rollout's NumPy stand-in with its checks, and the
trajectory data helpers and files."""
