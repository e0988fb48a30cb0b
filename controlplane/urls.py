from django.contrib import admin
from django.http import HttpRequest, JsonResponse
from django.urls import include, path


def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


urlpatterns = [
    path("healthz", healthz),
    path("admin/", admin.site.urls),
    path("api/v1/", include("jobs.api.urls")),
    path("api/v1/", include("tenants.api.urls")),
    path("api/v1/", include("billing.api.urls")),
    path("", include("frontend.urls")),
]
