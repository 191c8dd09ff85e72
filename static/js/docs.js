// /docs: starts the vendored Swagger UI. A module file, not an inline script: the server's CSP
// (app/http/security.py) allows scripts from this origin only.
// A request with a body must say Content-Type: application/json (the server refuses anything a
// cross-site form could send). Swagger UI sends no type for a bodiless POST, which the server
// serves from this page as well; it gets the JSON type too, so the curl line Swagger shows for
// it names the type the API documents.

const MUTATING = new Set(["POST", "PUT", "PATCH", "DELETE"]);

/** @param {{method: string, headers: Record<string, string>, body?: unknown}} req */
function withJsonType(req) {
  const named = Object.keys(req.headers || {}).some((h) => h.toLowerCase() === "content-type");
  if (MUTATING.has(String(req.method).toUpperCase()) && !named && (req.method.toUpperCase() === "POST" || req.body)) {
    req.headers = { ...req.headers, "Content-Type": "application/json" };
  }
  return req;
}

const bundle = /** @type {any} */ (window).SwaggerUIBundle;
bundle({
  url: document.body.dataset.openapi || "/openapi.json",
  dom_id: "#swagger-ui",
  layout: "BaseLayout",
  deepLinking: true,
  showExtensions: true,
  validatorUrl: null, // else it fetches a badge from validator.swagger.io
  presets: [bundle.presets.apis, bundle.SwaggerUIStandalonePreset],
  requestInterceptor: withJsonType,
});
