"""The HTTP edge: the server's own bounds before a request reaches the app (http.py), dependencies
(deps.py), one router per resource of the REST contract (routes/), the ASGI middlewares
(middleware.py), the error handlers (errors.py), Prometheus metrics (metrics.py), and the pages' files
(static.py, ui/). Routes parse, call one engine function (replication/engine.py) and return a model.
`selector_service.server.app.create_app` wires them together."""
