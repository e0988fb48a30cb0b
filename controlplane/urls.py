from csp.decorators import csp_update
from django.contrib import admin
from django.http import HttpRequest, JsonResponse
from django.urls import include, path, re_path
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerSplitView

from controlplane import health, metrics


@csrf_exempt  # a POST to a missing route is a 404, not a CSRF refusal
def api_not_found(request: HttpRequest) -> JsonResponse:
    """Under /api/ a client reads JSON, also for a path that is not there (Django's own 404 is a page)."""
    message = f"no API route {request.path}; the routes are listed at /api/v1/docs (schema: /api/v1/schema)"
    return JsonResponse({"error": {"code": "not_found", "message": message}}, status=404)


urlpatterns = [
    path("healthz", health.healthz),
    path("readyz", health.readyz),
    path("metrics", metrics.metrics_view),
    path("admin/", admin.site.urls),
    path("api/v1/schema", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/v1/docs", SpectacularSwaggerSplitView.as_view(url_name="api-schema"), name="api-docs"),
    # Redoc styles itself with <style> elements and renders in a worker: allowed on its page alone.
    path(
        "api/v1/redoc",
        csp_update({"style-src": ["'unsafe-inline'"], "worker-src": ["blob:"]})(
            SpectacularRedocView.as_view(url_name="api-schema", template_name="api/redoc.html")
        ),
        name="api-redoc",
    ),
    path("api/v1/", include("jobs.api.urls")),
    path("api/v1/", include("tenants.api.urls")),
    path("api/v1/", include("billing.api.urls")),
    re_path(r"^api/", api_not_found),
    path("", include("frontend.urls")),
]
