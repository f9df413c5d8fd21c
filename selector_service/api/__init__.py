"""The HTTP layer of the REST contract (docs/api.md): dependencies, one router per resource, the ASGI
middlewares and the error handlers. `selector_service.app.create_app` wires them together."""
