"""Additions to the OpenAPI document for routes that read their body themselves.

Such a route (observe parses its bytes in one pass; export and import move binary files) declares no
body parameter, so FastAPI cannot describe the body: these helpers put it in by hand.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel


def binary_body() -> dict[str, Any]:
    """`openapi_extra` of a route whose body is a binary file (an export, a raw metadata array)."""
    binary = {"schema": {"type": "string", "format": "binary"}}
    return {"requestBody": {"required": True, "content": {"application/octet-stream": binary}}}


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` of a route that validates its JSON body itself (see document_models)."""
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


def document_models(app: FastAPI, models: tuple[type[BaseModel], ...]) -> None:
    """Adds the JSON schemas of self-validated request bodies to the served OpenAPI document."""
    original = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        doc = original()
        schemas = doc.setdefault("components", {}).setdefault("schemas", {})
        for model in models:
            js = model.model_json_schema(ref_template="#/components/schemas/{model}")
            for name, sub in js.pop("$defs", {}).items():
                schemas.setdefault(name, sub)
            schemas[model.__name__] = js
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to replace the schema
