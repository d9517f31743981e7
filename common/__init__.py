"""Shared helpers for the onefile-rl scripts: trajectory data helpers and the trajectory file format."""
