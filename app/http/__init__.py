"""The HTTP layer, beside the routes: the middleware every request crosses (security.py: Host,
Origin, token, media type, security headers; head.py; limits.py), the token rules (auth.py),
the one error shape (errors.py), the completed OpenAPI description (openapi.py), the flattened
route list those read (routing_index.py) and uvicorn's h11 protocol as `kvscope serve` runs it
(protocol.py). Nothing is imported here: a module loads only what it names."""
