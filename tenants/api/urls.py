"""Routes of the tenants API, mounted under /api/v1/."""

from django.urls import path

from tenants.api import views

urlpatterns = [
    path("me", views.MeView.as_view(), name="api-me"),
    path("tokens", views.TokenListView.as_view(), name="api-tokens"),
    path("tokens/<int:token_id>/revoke", views.TokenRevokeView.as_view(), name="api-token-revoke"),
    path("operator/cohorts", views.CohortListView.as_view(), name="api-operator-cohorts"),
    path("operator/cohorts/<int:cohort_id>", views.CohortDetailView.as_view(), name="api-operator-cohort"),
    path("operator/tenants", views.TenantListView.as_view(), name="api-operator-tenants"),
    path("operator/tenants/<int:tenant_id>", views.TenantDetailView.as_view(), name="api-operator-tenant"),
    path("operator/tenants/<int:tenant_id>/quotas", views.TenantQuotasView.as_view(), name="api-operator-quotas"),
    path(
        "operator/tenants/<int:tenant_id>/quotas/<str:resource>",
        views.TenantQuotaView.as_view(),
        name="api-operator-quota",
    ),
]
