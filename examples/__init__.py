"""Runnable examples of the trainer adapters (docs/integrations.md); the test suite runs each of them."""
