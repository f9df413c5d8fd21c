"""One router per resource: datasets (lifecycle, beliefs, metadata, export and import), selection
(select, observe, score), history (the step history), operations (health, readiness, metrics), and the
pages: ui (the dashboard) and docs (OpenAPI document, Swagger UI, ReDoc)."""
