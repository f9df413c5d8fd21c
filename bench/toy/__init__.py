"""The toy world of GRPO learning dynamics behind bench/toy_world.py."""
