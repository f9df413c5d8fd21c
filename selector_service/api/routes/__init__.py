"""One router per resource: datasets (lifecycle, beliefs, metadata, export and import), selection
(select, observe, score) and operations (health, readiness, metrics)."""
