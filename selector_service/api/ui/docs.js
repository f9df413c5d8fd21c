// /docs and /redoc: fetch the OpenAPI document with the page's token (auth.js), then hand it to Swagger UI
// or ReDoc, both loaded from this service. Swagger UI is authorized with the same token, so that
// "Try it out" sends it; its Authorize button shows it and can replace it.
"use strict";

(async () => {
  const body = document.body;
  const config = JSON.parse(body.dataset.config || "{}");
  const target = document.getElementById("docs");
  const openapiPath = body.dataset.openapi.slice(Auth.root.length);
  try {
    const spec = await Auth.withToken(() => Auth.request(openapiPath));
    if (body.dataset.kind === "redoc") {
      Redoc.init(spec, { hideDownloadButton: false }, target);
    } else {
      const schemes = Object.keys((spec.components || {}).securitySchemes || {});
      const ui = SwaggerUIBundle({
        spec,
        domNode: target,
        layout: "BaseLayout",
        deepLinking: true,
        showExtensions: true,
        showCommonExtensions: true,
        validatorUrl: null, // the default asks a public validator about the document
        oauth2RedirectUrl: location.origin + config.oauth2RedirectUrl,
        presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
        ...(config.parameters || {}),
      });
      if (config.initOAuth) ui.initOAuth(config.initOAuth);
      const token = Auth.token();
      if (token) for (const scheme of schemes) ui.preauthorizeApiKey(scheme, token);
      window.ui = ui;
    }
    body.dataset.loaded = "1";
  } catch (err) {
    target.replaceChildren(document.createTextNode(`Could not load the API description: ${err.message}`));
  }
})();
