"""``/docs`` with Swagger UI served from this server, not a CDN.

FastAPI's default docs page loads Swagger UI's JavaScript and CSS from a CDN, so it is blank
on a machine without internet access (where agentflow is often run). The assets come from the
``swagger-ui-bundle-v2`` package (Swagger UI 5.x, which renders OpenAPI 3.1) and are mounted
under ``/docs-assets``; the page itself is FastAPI's own HTML pointed at them. ReDoc (also CDN
based) is turned off rather than left broken.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS = "/docs-assets"


def install(app: FastAPI) -> None:
    """Serve ``/docs`` from local assets (``create_app`` builds the app with docs off)."""
    from swagger_ui_bundle import swagger_ui_path

    app.mount(ASSETS, StaticFiles(directory=str(swagger_ui_path)), name="docs-assets")
    oauth_url = "/docs/oauth2-redirect"

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json", title=f"{app.title} API",
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}/favicon-32x32.png",
            oauth2_redirect_url=oauth_url)

    @app.get(oauth_url, include_in_schema=False)
    async def oauth_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()
